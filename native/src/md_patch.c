/* Patch: validate the delta's header, refuse an OLD of the wrong length before
 * writing anything, then apply frames in the order they arrive (the delta is read
 * once, front to back, so a pipe or a socket is as good as a file). Each frame's
 * checksum is verified before any of its commands runs; every length and offset is
 * bounded against the frame and against OLD; the output never exceeds the caller's
 * cap; the output is verified against the END frame.
 *
 * The wrong basis: a version 2 frame carries a hash of the OLD ranges it reads
 * (FORMAT.md), checked before the frame's bytes are written when the output
 * cannot be taken back (a pipe), or while they are written into a regular output
 * that started empty, which is truncated back to empty on any failure. A version 1
 * delta only records OLD's whole digest, which is checked as version 1 always did.
 *
 * OLD is read with pread, never mapped, so a file truncated under us reads short
 * and fails as "OLD shrank" instead of killing the process with SIGBUS. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>
#include <zstd.h>

#include "md_internal.h"

#define BASIS_BATCH 64u
#define OLD_BUF ((size_t)1 << 20)
#define HASH_PIECE ((size_t)32 << 10)

static md_status corrupt(md_error *err, const char *why) {
    return md_fail(err, MD_E_CORRUPT_DELTA, "the delta is corrupt: %s.", why);
}
static md_status truncated(md_error *err) {
    return md_fail(err, MD_E_TRUNCATED_DELTA, "the delta is truncated: it ends before its end marker.");
}
static md_status shrank(md_error *err) {
    return md_fail(err, MD_E_IO, "OLD shrank while it was being read (another process truncated it?).");
}
static md_status wrong_digest(md_error *err) {
    return md_fail(err, MD_E_WRONG_BASIS, "OLD is not the file this delta was made against: its digest differs.");
}

/* Reads exactly OLD[off, off + len). */
static md_status read_old(int fd, uint8_t *buf, size_t len, uint64_t off, md_error *err) {
    int64_t got = md_pread_full(fd, buf, len, off);
    if (got < 0) return md_fail_io(err, errno, "reading OLD");
    if ((size_t)got != len) return shrank(err);
    return MD_OK;
}

/* ---------------- version 1: the digest of all of OLD ---------------- */

typedef struct basis_ctx {
    int fd;
    uint64_t len, first_chunk;
    uint8_t (*digests)[16];
    uint8_t **bufs;
    int failed_errno;
    int short_read;
} basis_ctx;

static void basis_task(void *arg, size_t i, uint32_t worker) {
    basis_ctx *b = arg;
    uint64_t off = (b->first_chunk + i) * MD_CHUNK_LEN;
    size_t len = (size_t)(b->len - off < MD_CHUNK_LEN ? b->len - off : MD_CHUNK_LEN);
    int64_t got = md_pread_full(b->fd, b->bufs[worker], len, off);
    if (got < 0) {
        __atomic_store_n(&b->failed_errno, errno ? errno : EIO, __ATOMIC_RELAXED);
        return;
    }
    if ((size_t)got != len) {
        __atomic_store_n(&b->short_read, 1, __ATOMIC_RELAXED);
        return;
    }
    md_chunk_digest(b->bufs[worker], len, b->digests[i]);
}

/* The tree digest of OLD; chunks hashed in parallel, in batches (bounded memory). */
static md_status basis_digest(int fd, uint64_t len, uint32_t threads, uint8_t out[16], md_error *err) {
    md_status rc = MD_OK;
    uint32_t k = threads < MD_ROUND_CHUNKS_MAX ? threads : MD_ROUND_CHUNKS_MAX;
    uint8_t *bufs[MD_ROUND_CHUNKS_MAX] = {0};
    uint8_t digests[BASIS_BATCH][16];
    md_digest dg = {0};
    if (md_digest_init(&dg) != 0) return md_fail(err, MD_E_NOMEM, "out of memory while checking OLD.");
    size_t buf_len = (size_t)(len < MD_CHUNK_LEN ? (len ? len : 1) : MD_CHUNK_LEN);
    for (uint32_t t = 0; t < k; t++) {
        bufs[t] = malloc(buf_len);
        if (!bufs[t]) {
            rc = md_fail(err, MD_E_NOMEM, "out of memory while checking OLD.");
            goto done;
        }
    }
    uint64_t chunks = (len + MD_CHUNK_LEN - 1) / MD_CHUNK_LEN;
    for (uint64_t c0 = 0; c0 < chunks; c0 += BASIS_BATCH) {
        size_t batch = (size_t)(chunks - c0 < BASIS_BATCH ? chunks - c0 : BASIS_BATCH);
        basis_ctx b = {fd, len, c0, digests, bufs, 0, 0};
        md_parallel_for(k, batch, basis_task, &b);
        if (b.failed_errno) {
            rc = md_fail_io(err, b.failed_errno, "reading OLD");
            goto done;
        }
        if (b.short_read) {
            rc = shrank(err);
            goto done;
        }
        for (size_t i = 0; i < batch; i++) {
            uint64_t off = (c0 + i) * MD_CHUNK_LEN;
            md_digest_add_chunk(&dg, digests[i], len - off < MD_CHUNK_LEN ? len - off : MD_CHUNK_LEN);
        }
    }
    md_digest_final(&dg, out);
done:
    for (uint32_t t = 0; t < k; t++) free(bufs[t]);
    md_digest_free(&dg);
    return rc;
}

/* The deferred v1 check into a rewindable output: the cursor hashes OLD in order,
 * taking the bytes of each copy that continues where it stopped while they are
 * still in the CPU cache, and reading only the gaps. */
typedef struct basis_cursor {
    int on;
    uint64_t pos; /* OLD[0, pos) has gone into dg */
    md_digest dg;
} basis_cursor;

static md_status basis_catch_up(basis_cursor *bc, int fd, uint8_t *scratch, uint64_t upto, md_error *err) {
    while (bc->pos < upto) {
        size_t take = (size_t)(upto - bc->pos < OLD_BUF ? upto - bc->pos : OLD_BUF);
        md_status rc = read_old(fd, scratch, take, bc->pos, err);
        if (rc != MD_OK) return rc;
        md_digest_update(&bc->dg, scratch, take);
        bc->pos += take;
    }
    return MD_OK;
}

/* With two or more threads the v1 check runs on its own thread instead. */
typedef struct basis_helper {
    pthread_t tid;
    int started;
    int fd;
    int portable;
    uint64_t len;
    uint8_t digest[16];
    md_status rc;
    md_error err;
} basis_helper;

static void *basis_helper_main(void *arg) {
    basis_helper *h = arg;
    md_set_portable(h->portable);
    h->rc = basis_digest(h->fd, h->len, 1, h->digest, &h->err);
    return NULL;
}

static md_status basis_helper_finish(basis_helper *h, const uint8_t want[16], md_error *err) {
    pthread_join(h->tid, NULL);
    h->started = 0;
    if (h->rc != MD_OK) {
        if (err) *err = h->err;
        return h->rc;
    }
    if (MD_VERIFY_CHECKSUMS && memcmp(h->digest, want, 16) != 0) return wrong_digest(err);
    return MD_OK;
}

/* ---------------- the patcher ---------------- */

typedef struct patcher {
    int old_fd;
    uint64_t basis_len;
    unsigned version;
    int rewindable;
    uint64_t max_output;
    md_writer w;
    md_digest dg;             /* of the output */
    uint8_t *scratch;         /* OLD_BUF: OLD for checks and numeric frames */
    uint8_t *planes, *numout; /* MD_FRAME_MAX_LIT each: numeric frames */
    md_piece_hasher ph;       /* v2 basis check */
    int ph_on;                /* feed copies to ph as they are written */
    basis_cursor bc;          /* v1, one thread */
    const md_options *opt;    /* its cancel flag, read within frames too */
} patcher;

static md_status over_cap(const patcher *P, uint64_t len, md_error *err) {
    if (P->max_output && (len > P->max_output || P->w.total > P->max_output - len))
        return md_fail(err, MD_E_LIMIT,
                       "the delta would write more than the %llu bytes the output may have.",
                       (unsigned long long)P->max_output);
    return MD_OK;
}

static md_status put_out(patcher *P, const uint8_t *p, size_t len, md_error *err) {
    md_status rc = over_cap(P, len, err);
    if (rc != MD_OK) return rc;
    md_digest_update(&P->dg, p, len);
    if (md_writer_put(&P->w, p, len) != 0) return md_fail_io(err, P->w.failed_errno, "writing the output");
    return MD_OK;
}

/* Copies OLD[off, off + len) to the output, read straight into the writer's buffer. */
static md_status copy_range(patcher *P, uint64_t off, uint64_t len, md_error *err) {
    md_writer *w = &P->w;
    md_status rc = over_cap(P, len, err);
    if (rc != MD_OK) return rc;
    if (P->ph_on) md_ph_range(&P->ph, off, len);
    while (len) {
        if (w->len == w->cap && md_writer_flush(w) != 0) return md_fail_io(err, w->failed_errno, "writing the output");
        size_t room = w->cap - w->len;
        size_t take = (size_t)(len < room ? len : room);
        uint8_t *dst = w->buf + w->len;
        rc = read_old(P->old_fd, dst, take, off, err);
        if (rc != MD_OK) return rc;
        /* The two hashes of each copied byte (the output digest, the basis check) a
         * HASH_PIECE at a time, so that the second reads it from L1/L2: hashing the
         * whole read (up to 1 MiB) twice read much of it from L3 the second time. */
        for (size_t h = 0; h < take; h += HASH_PIECE) {
            size_t n = take - h < HASH_PIECE ? take - h : HASH_PIECE;
            md_digest_update(&P->dg, dst + h, n);
            if (P->ph_on) md_ph_feed(&P->ph, dst + h, n);
        }
        if (P->bc.on && off + take > P->bc.pos) {
            if (off > P->bc.pos) {
                rc = basis_catch_up(&P->bc, P->old_fd, P->scratch, off, err);
                if (rc != MD_OK) return rc;
            }
            uint64_t skip = P->bc.pos - off;
            md_digest_update(&P->bc.dg, dst + skip, (size_t)(take - skip));
            P->bc.pos = off + take;
        }
        w->len += take;
        w->total += take;
        off += take;
        len -= take;
        /* One frame may copy all of OLD (a delta of few changes): a cancel is seen
         * between pieces of it, not only between frames. */
        if (len && md_cancelled(P->opt)) return md_fail(err, MD_E_CANCELLED, "the patch was cancelled.");
    }
    return MD_OK;
}

/* Hashes OLD[off, off + len) into ph (reading it into `buf`, OLD_BUF bytes), for a
 * check before writing. */
static md_status hash_old(patcher *P, uint8_t *buf, uint64_t off, uint64_t len, md_error *err) {
    md_ph_range(&P->ph, off, len);
    while (len) {
        size_t take = (size_t)(len < OLD_BUF ? len : OLD_BUF);
        md_status rc = read_old(P->old_fd, buf, take, off, err);
        if (rc != MD_OK) return rc;
        md_ph_feed(&P->ph, buf, take);
        off += take;
        len -= take;
        if (len && md_cancelled(P->opt)) return md_fail(err, MD_E_CANCELLED, "the patch was cancelled.");
    }
    return MD_OK;
}

static md_status basis_mismatch(md_error *err, uint64_t lo, uint64_t hi) {
    return md_fail(err, MD_E_WRONG_BASIS,
                   "OLD is not the file this delta was made against: its bytes differ within "
                   "OLD[%llu, %llu).",
                   (unsigned long long)lo, (unsigned long long)hi);
}

/* Runs (or, with `check_only`, only validates and hashes the copies of, reading OLD
 * into check_buf) a DATA frame's commands. *lo and *hi get the span of OLD the copies
 * touch. */
static md_status run_commands(patcher *P, const uint8_t *cp, size_t cmd_len, const uint8_t *lp,
                              size_t lit_raw, uint8_t *check_buf, uint64_t *lo, uint64_t *hi, md_error *err) {
    int check_only = check_buf != NULL;
    size_t ci = 0, lit_used = 0;
    uint64_t prev_copy_end = 0;
    md_status rc;
    *lo = UINT64_MAX;
    *hi = 0;
    while (ci < cmd_len) {
        uint64_t word, len, delta_u;
        size_t used = md_get_varint(cp + ci, cmd_len - ci, &word);
        if (!used) return corrupt(err, "a command is malformed");
        ci += used;
        len = word >> 1;
        if (!len) return corrupt(err, "a command has length zero");
        if ((word & 1) == 0) {
            if (len > lit_raw - lit_used) return corrupt(err, "a literal runs past its frame");
            if (!check_only) {
                rc = put_out(P, lp + lit_used, (size_t)len, err);
                if (rc != MD_OK) return rc;
            }
            lit_used += (size_t)len;
            continue;
        }
        used = md_get_varint(cp + ci, cmd_len - ci, &delta_u);
        if (!used) return corrupt(err, "a command is malformed");
        ci += used;
        int64_t dlt = md_unzigzag(delta_u);
        uint64_t off = prev_copy_end + (uint64_t)dlt;
        /* off must not wrap and the copy must lie inside OLD */
        if ((dlt < 0 && (uint64_t)(-(dlt + 1)) >= prev_copy_end) || (dlt > 0 && off < prev_copy_end) ||
            off > P->basis_len || len > P->basis_len - off)
            return corrupt(err, "a copy reaches outside OLD");
        if (off < *lo) *lo = off;
        if (off + len > *hi) *hi = off + len;
        rc = check_only ? hash_old(P, check_buf, off, len, err) : copy_range(P, off, len, err);
        if (rc != MD_OK) return rc;
        prev_copy_end = off + len;
    }
    if (lit_used != lit_raw) return corrupt(err, "a frame carries literal bytes no command uses");
    return MD_OK;
}

/* A DATA frame whose literals are at lp: into a pipe only after its basis check
 * (reading OLD into check_buf), into a rewindable output checked as it is written. */
static md_status run_data(patcher *P, const uint8_t *cp, size_t cmd_len, const uint8_t *lp, uint32_t lit_raw,
                          uint64_t seq, uint64_t check, uint8_t *check_buf, md_error *err) {
    uint64_t lo, hi;
    md_status rc;
    if (P->version == 2 && !P->rewindable) {
        /* Nothing of this frame may reach a pipe before its basis check. */
        md_ph_frame(&P->ph, seq);
        rc = run_commands(P, cp, cmd_len, lp, lit_raw, check_buf, &lo, &hi, err);
        if (rc != MD_OK) return rc;
        if (MD_VERIFY_CHECKSUMS && P->ph.chain != check) return basis_mismatch(err, lo, hi);
    }
    P->ph_on = P->version == 2 && P->rewindable;
    md_ph_frame(&P->ph, seq);
    rc = run_commands(P, cp, cmd_len, lp, lit_raw, NULL, &lo, &hi, err);
    if (rc != MD_OK) return rc;
    if (P->ph_on && MD_VERIFY_CHECKSUMS && P->ph.chain != check) return basis_mismatch(err, lo, hi);
    return MD_OK;
}

/* A NUMERIC frame (v2): OLD[off, off + L) (or zeros) into `old`, and its basis check. */
static md_status numeric_old(patcher *P, const uint8_t *cp, int no_basis, uint32_t lit_raw, uint64_t seq,
                             uint64_t check, uint8_t *old, md_error *err) {
    uint64_t off = md_get_u64(cp);
    if (no_basis) {
        /* a tensor OLD does not have: its planes against zeros; no OLD to check */
        if (off || check != seq) return corrupt(err, "a numeric frame without basis names one");
        memset(old, 0, lit_raw);
        return MD_OK;
    }
    if (off > P->basis_len || lit_raw > P->basis_len - off) return corrupt(err, "a numeric frame reaches outside OLD");
    md_status rc = read_old(P->old_fd, old, lit_raw, off, err);
    if (rc != MD_OK) return rc;
    md_ph_frame(&P->ph, seq);
    md_ph_range(&P->ph, off, lit_raw);
    md_ph_feed(&P->ph, old, lit_raw);
    if (MD_VERIFY_CHECKSUMS && P->ph.chain != check) return basis_mismatch(err, off, off + lit_raw);
    return MD_OK;
}

/* Decodes a NUMERIC frame's `width` planes of `plane` bytes each (stored at sp, sizes
 * at cp + 8) into `planes`; 0 if one does not decode. Touches nothing but its
 * arguments, so it may run on the decoding thread. Planes coded with codec 3 or 4
 * are decoded two at a time (md_rans16_decode2: their work overlaps) when they have
 * the same codec; the others, and one left without a partner, alone. */
static int decode_planes(ZSTD_DCtx *dctx, const uint8_t *cp, const uint8_t *sp, unsigned width, size_t plane,
                         uint8_t *planes) {
    int pending = -1; /* a codec-3 or 4 plane waiting for a partner */
    unsigned pend_lanes = 0;
    const uint8_t *pend_src = NULL;
    size_t pend_len = 0;
    for (unsigned b = 0; b < width; b++) {
        uint32_t s = md_get_u32(cp + 8 + 4 * b);
        uint8_t *dst = planes + (size_t)b * plane;
        uint8_t codec = sp[0];
        unsigned lanes = codec == MD_PLANE_RANS16 ? 32 : codec == MD_PLANE_RANS64 ? 64 : 0;
        int ok;
        if (lanes && pending >= 0 && lanes != pend_lanes) {
            /* a pair is of one codec: the waiting plane goes alone */
            if (md_rans16_decode(pend_src, pend_len, planes + (size_t)pending * plane, plane, pend_lanes) != 0)
                return 0;
            pending = -1;
        }
        if (codec == MD_PLANE_RAW) {
            ok = s == 1 + plane;
            if (ok) memcpy(dst, sp + 1, plane);
        } else if (codec == MD_PLANE_ZSTD) {
            size_t z = ZSTD_decompressDCtx(dctx, dst, plane, sp + 1, s - 1);
            ok = !ZSTD_isError(z) && z == plane;
        } else if (lanes && pending < 0) {
            pending = (int)b;
            pend_lanes = lanes;
            pend_src = sp + 1;
            pend_len = s - 1;
            ok = 1;
        } else if (lanes) {
            ok = md_rans16_decode2(pend_src, pend_len, planes + (size_t)pending * plane, sp + 1, s - 1, dst, plane,
                                   lanes) == 0;
            pending = -1;
        } else {
            ok = codec == MD_PLANE_RANS && md_rans_decode(sp + 1, s - 1, dst, plane) == 0;
        }
        if (!ok) return 0;
        sp += s;
    }
    return pending < 0 || md_rans16_decode(pend_src, pend_len, planes + (size_t)pending * plane, plane,
                                           pend_lanes) == 0;
}

static md_status numeric_out(patcher *P, const uint8_t *old, const uint8_t *planes, uint32_t lit_raw,
                             unsigned width, md_error *err) {
    md_num_decode(old, planes, lit_raw, width, P->numout);
    return put_out(P, P->numout, lit_raw, err);
}

/* A NUMERIC frame on this thread alone. */
static md_status run_numeric(patcher *P, ZSTD_DCtx *dctx, const uint8_t *cp, const uint8_t *sp,
                             unsigned width, int no_basis, uint32_t lit_raw, uint64_t seq, uint64_t check,
                             md_error *err) {
    md_status rc = numeric_old(P, cp, no_basis, lit_raw, seq, check, P->scratch, err);
    if (rc != MD_OK) return rc;
    if (!decode_planes(dctx, cp, sp, width, lit_raw / width, P->planes))
        return corrupt(err, "a numeric plane does not decode");
    return numeric_out(P, P->scratch, P->planes, lit_raw, width, err);
}

/* ---------------- threads >= 2: frames decoded on a second thread ----------------
 *
 * The decoding of a NUMERIC frame's planes (the rANS gathers: half of a bf16 patch),
 * or of a DATA frame's zstd literals (a quarter of a patch of the corpus), runs on
 * the decoder thread while this thread writes the frame before it (the inverse
 * transform or the copies, the hashes, the write) and reads and checks the next
 * one. Frames still reach the output in order and every check runs as before: a
 * NUMERIC frame's OLD and basis check before its planes go to the decoder, a DATA
 * frame's commands and basis check once its literals decoded, a frame's output only
 * once it decoded, and on any later error the frame still pending is finished first
 * (so its error, or its bytes, come first, as one thread gives). Two sets of buffers
 * (frame, OLD, planes, literals) alternate between the frames. */
typedef struct decoder {
    pthread_t tid;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int started, busy, quit, portable, ok;
    int used; /* given a frame: DeltaStats.threads counts the thread only then */
    ZSTD_DCtx *dctx;
    const uint8_t *cp, *sp; /* a numeric frame's commands and planes, or the literals' zstd frame */
    unsigned width;         /* 0: a DATA frame's literals, `plane` bytes of them */
    size_t plane, stored;
    uint8_t *planes; /* the decoded planes or literals */
} decoder;

/* A DATA frame's zstd literals into exactly `len` bytes at dst; 0 if they do not. */
static int decode_literals(ZSTD_DCtx *dctx, const uint8_t *src, size_t stored, uint8_t *dst, size_t len) {
    size_t z = ZSTD_decompressDCtx(dctx, dst, len, src, stored);
    return !ZSTD_isError(z) && z == len;
}

static void *decoder_main(void *arg) {
    decoder *D = arg;
    md_set_portable(D->portable);
    pthread_mutex_lock(&D->mu);
    for (;;) {
        while (!D->busy && !D->quit) pthread_cond_wait(&D->cv, &D->mu);
        if (D->quit) break;
        pthread_mutex_unlock(&D->mu);
        int ok = D->width ? decode_planes(D->dctx, D->cp, D->sp, D->width, D->plane, D->planes)
                          : decode_literals(D->dctx, D->sp, D->stored, D->planes, D->plane);
        pthread_mutex_lock(&D->mu);
        D->ok = ok;
        D->busy = 0;
        pthread_cond_broadcast(&D->cv);
    }
    pthread_mutex_unlock(&D->mu);
    return NULL;
}

static int decoder_start(decoder *D, int portable) {
    memset(D, 0, sizeof *D);
    D->portable = portable;
    D->dctx = ZSTD_createDCtx();
    if (!D->dctx) return -1;
    if (pthread_mutex_init(&D->mu, NULL) != 0) goto no_mutex;
    if (pthread_cond_init(&D->cv, NULL) != 0) goto no_cond;
    if (pthread_create(&D->tid, NULL, decoder_main, D) != 0) goto no_thread;
    D->started = 1;
    return 0;
no_thread:
    pthread_cond_destroy(&D->cv);
no_cond:
    pthread_mutex_destroy(&D->mu);
no_mutex:
    ZSTD_freeDCtx(D->dctx);
    D->dctx = NULL;
    return -1;
}

/* width 0: sp holds `stored` bytes of zstd literals that decode to `plane` bytes */
static void decoder_submit(decoder *D, const uint8_t *cp, const uint8_t *sp, size_t stored, unsigned width,
                           size_t plane, uint8_t *planes) {
    pthread_mutex_lock(&D->mu);
    D->cp = cp;
    D->sp = sp;
    D->stored = stored;
    D->width = width;
    D->plane = plane;
    D->planes = planes;
    D->busy = 1;
    D->used = 1;
    pthread_cond_broadcast(&D->cv);
    pthread_mutex_unlock(&D->mu);
}

/* Waits for the submitted frame; whether its planes decoded. */
static int decoder_wait(decoder *D) {
    pthread_mutex_lock(&D->mu);
    while (D->busy) pthread_cond_wait(&D->cv, &D->mu);
    int ok = D->ok;
    pthread_mutex_unlock(&D->mu);
    return ok;
}

static void decoder_stop(decoder *D) {
    if (!D->started) return;
    pthread_mutex_lock(&D->mu);
    while (D->busy) pthread_cond_wait(&D->cv, &D->mu);
    D->quit = 1;
    pthread_cond_broadcast(&D->cv);
    pthread_mutex_unlock(&D->mu);
    pthread_join(D->tid, NULL);
    pthread_cond_destroy(&D->cv);
    pthread_mutex_destroy(&D->mu);
    ZSTD_freeDCtx(D->dctx);
    D->started = 0;
}

/* The frame the decoder has (if any): a NUMERIC frame (its OLD and planes), or a
 * DATA frame (its commands, literals, seq and check; `old` is then the buffer its
 * check before a pipe reads OLD into: that set's, which a DATA frame leaves free). */
typedef struct pending_frame {
    int on, data;
    uint8_t *old;
    const uint8_t *planes; /* the planes, or the literals */
    uint32_t len;          /* bytes of output, or of literals */
    unsigned width;
    const uint8_t *cp;
    uint32_t cmd_len;
    uint64_t seq, check;
} pending_frame;

static md_status undecodable(const pending_frame *pf, md_error *err) {
    return corrupt(err, pf->data ? "a literal block does not decompress" : "a numeric plane does not decode");
}

static md_status write_pending(patcher *P, const pending_frame *pf, md_error *err) {
    if (pf->data) return run_data(P, pf->cp, pf->cmd_len, pf->planes, pf->len, pf->seq, pf->check, pf->old, err);
    return numeric_out(P, pf->old, pf->planes, pf->len, pf->width, err);
}

/* Waits for the pending frame and writes it. */
static md_status finish_pending(patcher *P, decoder *D, pending_frame *pf, md_error *err) {
    if (!pf->on) return MD_OK;
    pf->on = 0;
    if (!decoder_wait(D)) return undecodable(pf, err);
    return write_pending(P, pf, err);
}

/* The pipeline's step: waits for the pending frame, hands the decoder `next` (sp:
 * its planes, or its `stored` bytes of zstd literals), then writes the frame waited
 * for; `next` is pending after. On an error `next` is dropped, once the decoder is
 * done with it: it comes after the error. */
static md_status pipeline_step(patcher *P, decoder *D, pending_frame *pf, const pending_frame *next,
                               const uint8_t *sp, size_t stored, md_error *err) {
    pending_frame prev = *pf;
    pf->on = 0;
    if (prev.on && !decoder_wait(D)) return undecodable(&prev, err);
    if (next->data)
        decoder_submit(D, next->cp, sp, stored, 0, next->len, (uint8_t *)next->planes);
    else
        decoder_submit(D, next->cp, sp, 0, next->width, next->len / next->width, (uint8_t *)next->planes);
    *pf = *next;
    if (prev.on) {
        md_status rc = write_pending(P, &prev, err);
        if (rc != MD_OK) {
            pf->on = 0;
            (void)decoder_wait(D);
            return rc;
        }
    }
    return MD_OK;
}

md_status md_patch(int old_fd, int delta_fd, int out_fd, const md_options *opt, md_stats *stats, md_error *err) {
    uint8_t hdr[MD_HEADER_LEN];
    uint32_t threads;
    md_status rc = md_begin(opt, &threads, err);
    if (rc != MD_OK) return rc;
    int64_t got = md_read_full(delta_fd, hdr, sizeof hdr);
    if (got < 0) return md_fail_io(err, errno, "reading the delta");
    if (got < (int64_t)sizeof hdr) {
        if (got >= (int64_t)MD_DELTA_MAGIC_LEN && memcmp(hdr, MD_DELTA_MAGIC, MD_DELTA_MAGIC_LEN) != 0)
            return corrupt(err, "it is not a Meridian delta");
        return truncated(err);
    }
    if (memcmp(hdr, MD_DELTA_MAGIC, MD_DELTA_MAGIC_LEN) != 0) return corrupt(err, "it is not a Meridian delta");
    if (MD_VERIFY_CHECKSUMS && md_get_u64(hdr + 56) != XXH3_64bits(hdr, 56))
        return corrupt(err, "its header fails its checksum");
    unsigned version = hdr[7];
    if ((version != 1 && version != 2) || md_get_u32(hdr + 8) != version)
        return corrupt(err, "its format version is not supported");
    if (md_get_u32(hdr + 12) != 0) return corrupt(err, "it sets unknown flags");
    uint64_t basis_len = md_get_u64(hdr + 16);
    uint32_t block_len = md_get_u32(hdr + 40), strong_len = md_get_u32(hdr + 44);
    if (version == 2 && (block_len < 1 || block_len > MD_MAX_BLOCK_LEN || strong_len < 8 || strong_len > 16))
        return corrupt(err, "its header declares an impossible block");
    const uint32_t hdr_len = version == 1 ? MD_FRAME_HDR_LEN_V1 : MD_FRAME_HDR_LEN;

    struct stat st;
    if (fstat(old_fd, &st) != 0) return md_fail_io(err, errno, "reading OLD");
    if (!S_ISREG(st.st_mode)) return md_fail(err, MD_E_INVALID, "OLD must be a regular file.");
    if ((uint64_t)st.st_size != basis_len)
        return md_fail(err, MD_E_WRONG_BASIS,
                       "OLD is not the file this delta was made against: it has %llu bytes, "
                       "the delta expects %llu.",
                       (unsigned long long)st.st_size, (unsigned long long)basis_len);
    /* A regular output that we write from its start can be truncated back to nothing
     * (so checks may run alongside the writes); anything else (a pipe, say) must have
     * them before. */
    int rewindable;
    {
        struct stat ost;
        rewindable = fstat(out_fd, &ost) == 0 && S_ISREG(ost.st_mode) && ost.st_size == 0 &&
                     lseek(out_fd, 0, SEEK_CUR) == 0;
    }
    if (version == 1 && MD_VERIFY_CHECKSUMS && !rewindable) {
        uint8_t have[16];
        rc = basis_digest(old_fd, basis_len, threads, have, err);
        if (rc != MD_OK) return rc;
        if (memcmp(have, hdr + 24, 16) != 0) return wrong_digest(err);
    }

    size_t frame_cap = MD_FRAME_HDR_LEN + MD_FRAME_MAX_CMD + ZSTD_compressBound(MD_FRAME_MAX_LIT) + 8;
    /* The buffers every frame writes through, in one scratch mapping (huge pages:
     * ~900 4 KiB faults a call were a tenth of a patch of a few MiB): OLD's window,
     * the planes and numbers of numeric frames, the frame, its literals. */
    size_t frame_room = (frame_cap + 63) & ~(size_t)63;
    /* With threads >= 2 a second OLD window, planes, frame and literals follow (the
     * decoder). */
    int pipelined = version == 2 && threads >= 2;
    size_t one_set = OLD_BUF + 2 * (size_t)MD_FRAME_MAX_LIT + frame_room + MD_FRAME_MAX_LIT;
    size_t scratch_len = one_set + (pipelined ? OLD_BUF + 2 * (size_t)MD_FRAME_MAX_LIT + frame_room : 0);
    uint8_t *scratch = md_scratch_alloc(scratch_len);
    uint8_t *fbuf = scratch ? scratch + OLD_BUF + 2 * (size_t)MD_FRAME_MAX_LIT : NULL;
    uint8_t *lit = scratch ? fbuf + frame_room : NULL;
    /* per set: OLD's window, the planes, the frame */
    uint8_t *set_old[2] = {scratch, scratch ? scratch + one_set : NULL};
    uint8_t *set_planes[2] = {scratch ? scratch + OLD_BUF : NULL, set_old[1] ? set_old[1] + OLD_BUF : NULL};
    uint8_t *set_frame[2] = {fbuf, set_planes[1] ? set_planes[1] + MD_FRAME_MAX_LIT : NULL};
    uint8_t *set_lit[2] = {lit, set_frame[1] ? set_frame[1] + frame_room : NULL};
    unsigned set = 0;
    decoder D = {0};
    pending_frame pf = {0};
    ZSTD_DCtx *dctx = ZSTD_createDCtx();
    patcher P;
    memset(&P, 0, sizeof P);
    P.old_fd = old_fd;
    P.opt = opt;
    P.basis_len = basis_len;
    P.version = version;
    P.rewindable = rewindable;
    P.max_output = opt ? opt->max_output : 0;
    P.scratch = scratch;
    if (version == 2 && scratch) {
        P.planes = scratch + OLD_BUF;
        P.numout = P.planes + MD_FRAME_MAX_LIT;
    }
    uint64_t in_bytes = sizeof hdr;
    int ok = fbuf && lit && dctx && P.scratch && (version == 1 || (P.planes && P.numout)) &&
             md_writer_init(&P.w, out_fd, 1 << 20) == 0 && md_digest_init(&P.dg) == 0 &&
             md_ph_init(&P.ph, block_len, strong_len) == 0;
    basis_helper helper = {0};
    helper.fd = old_fd;
    helper.len = basis_len;
    helper.portable = md_get_portable();
    if (ok && version == 1 && rewindable && threads >= 2)
        helper.started = pthread_create(&helper.tid, NULL, basis_helper_main, &helper) == 0;
    if (ok && version == 1 && rewindable && !helper.started) {
        ok = md_digest_init(&P.bc.dg) == 0;
        P.bc.on = ok;
    }
    if (ok && pipelined) pipelined = decoder_start(&D, md_get_portable()) == 0;
    if (!ok) {
        rc = md_fail(err, MD_E_NOMEM, "out of memory while patching.");
        goto done;
    }
    /* A regular output that we write from its start may get holes for zeros. */
    P.w.sparse = rewindable;
    P.w.prealloc = rewindable && md_prealloc_pays(out_fd);
    P.w.durable = opt && (opt->flags & MD_DURABLE);
    for (uint64_t seq = 0;; seq++) {
        if (md_cancelled(opt)) {
            rc = md_fail(err, MD_E_CANCELLED, "the patch was cancelled.");
            goto done;
        }
        got = md_read_full(delta_fd, fbuf, hdr_len);
        if (got < 0) {
            rc = md_fail_io(err, errno, "reading the delta");
            goto done;
        }
        if (got < (int64_t)hdr_len) {
            rc = truncated(err);
            goto done;
        }
        /* The header has its own checksum, so a damaged length reads as corruption,
         * never as a truncated file, and is never used to size a read. */
        if (MD_VERIFY_CHECKSUMS && md_get_u64(fbuf + hdr_len - 8) != XXH3_64bits(fbuf, hdr_len - 8)) {
            rc = corrupt(err, "a frame header fails its checksum");
            goto done;
        }
        uint8_t type = fbuf[0], codec = fbuf[1], param = fbuf[2];
        uint32_t cmd_len = md_get_u32(fbuf + 4), lit_raw = md_get_u32(fbuf + 8);
        uint32_t stored = md_get_u32(fbuf + 12);
        uint64_t check = version == 2 ? md_get_u64(fbuf + 24) : 0;
        unsigned width = 1u << (param & 3);
        if (type != MD_FRAME_DATA && type != MD_FRAME_END && !(version == 2 && type == MD_FRAME_NUMERIC)) {
            rc = corrupt(err, "a frame has an unknown type");
            goto done;
        }
        if ((type == MD_FRAME_NUMERIC ? param > (3 | MD_NUMERIC_NO_BASIS) : param != 0) || fbuf[3] ||
            md_get_u64(fbuf + 16) != seq) {
            rc = corrupt(err, "a frame header is malformed or out of sequence");
            goto done;
        }
        int bad;
        if (type == MD_FRAME_END)
            bad = codec || cmd_len != MD_END_PAYLOAD_LEN || lit_raw || stored || check;
        else if (type == MD_FRAME_NUMERIC)
            bad = codec || cmd_len != 8 + 4 * width || !lit_raw || lit_raw > MD_FRAME_MAX_LIT ||
                  lit_raw % width || stored > lit_raw + width;
        else
            bad = cmd_len > MD_FRAME_MAX_CMD || lit_raw > MD_FRAME_MAX_LIT ||
                  (codec == MD_CODEC_RAW && stored != lit_raw) ||
                  (codec == MD_CODEC_ZSTD && (stored > ZSTD_compressBound(lit_raw) || !lit_raw)) ||
                  codec > MD_CODEC_ZSTD;
        if (bad) {
            rc = corrupt(err, "a frame declares impossible lengths");
            goto done;
        }
        size_t body = (size_t)cmd_len + stored + 8;
        got = md_read_full(delta_fd, fbuf + hdr_len, body);
        if (got < 0) {
            rc = md_fail_io(err, errno, "reading the delta");
            goto done;
        }
        if ((size_t)got != body) {
            rc = truncated(err);
            goto done;
        }
        in_bytes += hdr_len + body;
        size_t sum_at = hdr_len + cmd_len + stored;
        if (MD_VERIFY_CHECKSUMS && md_get_u64(fbuf + sum_at) != md_h64(fbuf, sum_at, 0)) {
            rc = corrupt(err, "a frame fails its checksum");
            goto done;
        }
        const uint8_t *cp = fbuf + hdr_len;
        int data_pipelined = pipelined && type == MD_FRAME_DATA && codec == MD_CODEC_ZSTD;
        if (type != MD_FRAME_NUMERIC && !data_pipelined) {
            /* frames reach the output in order */
            rc = finish_pending(&P, &D, &pf, err);
            if (rc != MD_OK) goto done;
        }
        if (type == MD_FRAME_END) {
            uint8_t digest[16], probe;
            if (P.bc.on) {
                uint8_t have[16];
                rc = basis_catch_up(&P.bc, old_fd, P.scratch, basis_len, err);
                if (rc != MD_OK) goto done;
                md_digest_final(&P.bc.dg, have);
                P.bc.on = 0;
                if (MD_VERIFY_CHECKSUMS && memcmp(have, hdr + 24, 16) != 0) {
                    rc = wrong_digest(err);
                    goto done;
                }
            }
            if (helper.started) {
                rc = basis_helper_finish(&helper, hdr + 24, err);
                if (rc != MD_OK) goto done;
            }
            if (md_writer_finish(&P.w) != 0) {
                rc = md_fail_io(err, P.w.failed_errno, "writing the output");
                goto done;
            }
            got = md_read_full(delta_fd, &probe, 1);
            if (got != 0) {
                rc = got < 0 ? md_fail_io(err, errno, "reading the delta")
                             : corrupt(err, "it has bytes after its end marker");
                goto done;
            }
            md_digest_final(&P.dg, digest);
            if (md_get_u64(cp) != P.w.total) {
                rc = corrupt(err, "the output length differs from the one it records");
                goto done;
            }
            if (MD_VERIFY_CHECKSUMS && memcmp(digest, cp + 8, 16) != 0) {
                rc = corrupt(err, "the output digest differs from the one it records");
                goto done;
            }
            break;
        }
        if (type == MD_FRAME_NUMERIC) {
            uint64_t sum = 0;
            for (unsigned b = 0; b < width; b++) {
                uint32_t s = md_get_u32(cp + 8 + 4 * b);
                if (s < 2 || s > 1 + lit_raw / width) sum = UINT64_MAX; /* codec byte + bytes */
                else if (sum != UINT64_MAX) sum += s;
            }
            if (sum != stored) {
                rc = corrupt(err, "a numeric frame declares impossible plane sizes");
                goto done;
            }
            if (!pipelined) {
                rc = run_numeric(&P, dctx, cp, cp + cmd_len, width, param & MD_NUMERIC_NO_BASIS, lit_raw, seq,
                                 check, err);
                if (rc != MD_OK) goto done;
            } else {
                /* this frame's OLD and check; then the decoder takes its planes once it
                 * is done with the previous frame's, which this thread then writes */
                rc = numeric_old(&P, cp, param & MD_NUMERIC_NO_BASIS, lit_raw, seq, check, set_old[set], err);
                if (rc != MD_OK) goto done;
                pending_frame next = {.on = 1, .old = set_old[set], .planes = set_planes[set], .len = lit_raw,
                                      .width = width, .cp = cp};
                rc = pipeline_step(&P, &D, &pf, &next, cp + cmd_len, 0, err);
                if (rc != MD_OK) goto done;
                set ^= 1;
                fbuf = set_frame[set];
            }
        } else if (data_pipelined) {
            /* its literals decode while the frame before it is written */
            pending_frame next = {.on = 1, .data = 1, .old = set_old[set], .planes = set_lit[set], .len = lit_raw,
                                  .cp = cp, .cmd_len = cmd_len, .seq = seq, .check = check};
            rc = pipeline_step(&P, &D, &pf, &next, cp + cmd_len, stored, err);
            if (rc != MD_OK) goto done;
            set ^= 1;
            fbuf = set_frame[set];
        } else {
            const uint8_t *lp = cp + cmd_len;
            if (codec == MD_CODEC_ZSTD) {
                if (!decode_literals(dctx, lp, stored, lit, lit_raw)) {
                    rc = corrupt(err, "a literal block does not decompress");
                    goto done;
                }
                lp = lit;
            }
            rc = run_data(&P, cp, cmd_len, lp, lit_raw, seq, check, P.scratch, err);
            if (rc != MD_OK) goto done;
        }
        if (opt && opt->progress) __atomic_store_n(opt->progress, in_bytes, __ATOMIC_RELAXED);
    }
    if (stats) {
        memset(stats, 0, sizeof *stats);
        stats->input_bytes = in_bytes;
        stats->output_bytes = P.w.total;
        stats->threads = (version == 1 && helper.started) || D.used ? 2 : 1;
    }
done:
    if (rc != MD_OK && pf.on) {
        /* the frame before the failing one comes first: its own error, or its bytes */
        md_status prc = finish_pending(&P, &D, &pf, err);
        if (prc != MD_OK) rc = prc;
    }
    decoder_stop(&D);
    if (rc != MD_OK && rewindable) {
        /* The deferred v1 check has not finished: a damaged delta applied to the wrong
         * OLD is reported as the wrong basis, as the up-front check would have. */
        md_error basis_err;
        int damaged = rc == MD_E_CORRUPT_DELTA || rc == MD_E_TRUNCATED_DELTA;
        md_status brc = MD_OK;
        if (helper.started) {
            brc = basis_helper_finish(&helper, hdr + 24, &basis_err);
        } else if (P.bc.on && damaged && P.scratch) {
            uint8_t have[16];
            brc = basis_catch_up(&P.bc, old_fd, P.scratch, basis_len, &basis_err);
            if (brc == MD_OK) {
                md_digest_final(&P.bc.dg, have);
                if (MD_VERIFY_CHECKSUMS && memcmp(have, hdr + 24, 16) != 0) brc = wrong_digest(&basis_err);
            }
        }
        if (damaged && brc == MD_E_WRONG_BASIS) {
            rc = MD_E_WRONG_BASIS;
            if (err) *err = basis_err;
        }
        /* Leave no output behind: the file was empty when we started. */
        if (ftruncate(out_fd, 0) != 0) { /* the error already reported matters more */
        }
    } else if (helper.started) {
        pthread_join(helper.tid, NULL);
    }
    if (P.bc.dg.top) md_digest_free(&P.bc.dg);
    md_ph_free(&P.ph);
    md_scratch_free(scratch, scratch_len);
    ZSTD_freeDCtx(dctx);
    md_writer_free(&P.w);
    md_digest_free(&P.dg);
    return rc;
}
