/* Patch: validate the delta's header, refuse the wrong OLD (its length before
 * writing anything; its digest before writing into a pipe, alongside the patch
 * into a regular file that is truncated back to empty on refusal), then apply
 * frames in order. Each frame's checksum is verified
 * before any of its commands runs; every length and offset is bounded against
 * the frame and against OLD; the output is verified against the END frame. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>
#include <zstd.h>

#include "md_internal.h"

#define BASIS_BATCH 64u

static md_status corrupt(md_error *err, const char *why) {
    return md_fail(err, MD_E_CORRUPT_DELTA, "the delta is corrupt: %s.", why);
}
static md_status truncated(md_error *err) {
    return md_fail(err, MD_E_TRUNCATED_DELTA, "the delta is truncated: it ends before its end marker.");
}

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
    /* Hash straight from the page cache when OLD can be mapped. */
    void *m = mmap(NULL, len, PROT_READ, MAP_SHARED | MAP_POPULATE, b->fd, (off_t)off);
    if (m != MAP_FAILED) {
        md_chunk_digest(m, len, b->digests[i]);
        munmap(m, len);
        return;
    }
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
            rc = md_fail(err, MD_E_IO, "OLD shrank while it was being read.");
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

/* OLD is read through a sliding mmap window: copies are hashed and written
 * straight from the page cache (one memory copy instead of two), and only the
 * window is ever mapped, so RSS stays bounded whatever the size of OLD. */
#define WINDOW_LEN ((uint64_t)16 << 20)
#define COPY_PIECE ((uint64_t)256 << 10)
typedef struct old_view {
    int fd;
    uint64_t len;
    uint8_t *map;
    uint64_t map_off, map_len;
    int no_mmap;
} old_view;

static void view_unmap(old_view *v) {
    if (v->map) munmap(v->map, (size_t)v->map_len);
    v->map = NULL;
    v->map_len = 0;
}

/* Returns a pointer to OLD[off, off + *len) with *len shortened to what the window holds. */
static const uint8_t *view_get(old_view *v, uint64_t off, uint64_t *len) {
    if (v->no_mmap) return NULL;
    if (!v->map || off < v->map_off || off >= v->map_off + v->map_len) {
        view_unmap(v);
        uint64_t start = off & ~(WINDOW_LEN - 1);
        uint64_t mlen = v->len - start < WINDOW_LEN ? v->len - start : WINDOW_LEN;
        void *m = mmap(NULL, (size_t)mlen, PROT_READ, MAP_SHARED | MAP_POPULATE, v->fd, (off_t)start);
        if (m == MAP_FAILED) {
            v->no_mmap = 1;
            return NULL;
        }
        v->map = m;
        v->map_off = start;
        v->map_len = mlen;
    }
    uint64_t avail = v->map_off + v->map_len - off;
    if (*len > avail) *len = avail;
    return v->map + (off - v->map_off);
}

/* The deferred basis check. When the output is a regular file written from its
 * start, OLD's digest is computed during the patch instead of before it: the
 * cursor hashes OLD in order, taking the bytes of each copy that continues where
 * it stopped while they are still in the CPU cache from the copy itself, and
 * reading only the gaps (and whatever no copy touched, at the end). So OLD goes
 * through memory about once instead of twice. A mismatch is still refused as the
 * wrong basis, and the output is then truncated to nothing (see md_patch). */
#define CATCHUP_BUF ((size_t)1 << 20)
typedef struct basis_cursor {
    int on;
    uint64_t pos; /* OLD[0, pos) has gone into dg */
    md_digest dg;
    old_view view;    /* its own window, for long gaps only (unmapped after each) */
    uint8_t *scratch; /* short gaps, or when OLD cannot be mapped */
} basis_cursor;

/* Hashes OLD[pos, upto). `main` is the copy path's window: a gap it already maps costs no I/O. */
static md_status basis_catch_up(basis_cursor *bc, old_view *main, uint64_t upto, md_error *err) {
    while (bc->pos < upto) {
        uint64_t want = upto - bc->pos, take = want;
        const uint8_t *src = NULL;
        if (main->map && bc->pos >= main->map_off && bc->pos < main->map_off + main->map_len) {
            src = main->map + (bc->pos - main->map_off);
            uint64_t avail = main->map_off + main->map_len - bc->pos;
            if (take > avail) take = avail;
        } else if (want >= CATCHUP_BUF * 4 && !bc->view.no_mmap) {
            src = view_get(&bc->view, bc->pos, &take);
        }
        if (!src) {
            take = want < CATCHUP_BUF ? want : CATCHUP_BUF;
            int64_t got = md_pread_full(bc->view.fd, bc->scratch, (size_t)take, bc->pos);
            if (got < 0) return md_fail_io(err, errno, "reading OLD");
            if ((uint64_t)got != take) return md_fail(err, MD_E_IO, "OLD shrank while it was being read.");
            src = bc->scratch;
        }
        md_digest_update(&bc->dg, src, (size_t)take);
        bc->pos += take;
    }
    view_unmap(&bc->view);
    return MD_OK;
}

/* OLD[off, off + len), at src, has just been copied: feed what continues the cursor. */
static md_status basis_feed(basis_cursor *bc, old_view *main, uint64_t off, uint64_t len,
                            const uint8_t *src, md_error *err) {
    if (!bc->on || off + len <= bc->pos) return MD_OK;
    if (off > bc->pos) {
        md_status rc = basis_catch_up(bc, main, off, err);
        if (rc != MD_OK) return rc;
    }
    uint64_t skip = bc->pos - off;
    md_digest_update(&bc->dg, src + skip, (size_t)(len - skip));
    bc->pos = off + len;
    return MD_OK;
}

/* Finishes the deferred check: MD_OK if OLD's digest is `want`. */
static md_status basis_finish(basis_cursor *bc, old_view *main, uint64_t len, const uint8_t want[16],
                              md_error *err) {
    uint8_t have[16];
    md_status rc = basis_catch_up(bc, main, len, err);
    if (rc != MD_OK) return rc;
    md_digest_final(&bc->dg, have);
    bc->on = 0;
    if (MD_VERIFY_CHECKSUMS && memcmp(have, want, 16) != 0)
        return md_fail(err, MD_E_WRONG_BASIS,
                       "OLD is not the file this delta was made against: its digest differs.");
    return MD_OK;
}

/* With two or more threads the basis check runs on its own thread instead, in
 * parallel with the patch (the main thread then hashes only the output). */
typedef struct basis_helper {
    pthread_t tid;
    int started;
    int fd;
    uint64_t len;
    uint8_t digest[16];
    md_status rc;
    md_error err;
} basis_helper;

static void *basis_helper_main(void *arg) {
    basis_helper *h = arg;
    h->rc = basis_digest(h->fd, h->len, 1, h->digest, &h->err);
    return NULL;
}

/* Joins the helper; MD_OK if OLD's digest is `want`. */
static md_status basis_helper_finish(basis_helper *h, const uint8_t want[16], md_error *err) {
    pthread_join(h->tid, NULL);
    h->started = 0;
    if (h->rc != MD_OK) {
        if (err) *err = h->err;
        return h->rc;
    }
    if (MD_VERIFY_CHECKSUMS && memcmp(h->digest, want, 16) != 0)
        return md_fail(err, MD_E_WRONG_BASIS,
                       "OLD is not the file this delta was made against: its digest differs.");
    return MD_OK;
}

/* Copies OLD[off, off + len) to the output. */
static md_status copy_range(old_view *v, uint64_t off, uint64_t len, md_writer *w, md_digest *dg,
                            basis_cursor *bc, md_error *err) {
    while (len) {
        uint64_t take = len;
        const uint8_t *src = view_get(v, off, &take);
        if (src) {
            /* Hash then write piece by piece, so the write reads what the hash
             * just brought into the cache: one trip through memory, not two. */
            if (take > COPY_PIECE) take = COPY_PIECE;
            md_digest_update(dg, src, (size_t)take);
            md_status rc = basis_feed(bc, v, off, take, src, err);
            if (rc != MD_OK) return rc;
            if (md_writer_put(w, src, (size_t)take) != 0)
                return md_fail_io(err, w->failed_errno, "writing the output");
            off += take;
            len -= take;
            continue;
        }
        if (w->len == w->cap && md_writer_flush(w) != 0)
            return md_fail_io(err, w->failed_errno, "writing the output");
        size_t room = w->cap - w->len;
        take = len < room ? len : room;
        int64_t got = md_pread_full(v->fd, w->buf + w->len, (size_t)take, off);
        if (got < 0) return md_fail_io(err, errno, "reading OLD");
        if ((uint64_t)got != take) return md_fail(err, MD_E_IO, "OLD shrank while it was being read.");
        md_digest_update(dg, w->buf + w->len, (size_t)take);
        md_status rc = basis_feed(bc, v, off, take, w->buf + w->len, err);
        if (rc != MD_OK) return rc;
        w->len += (size_t)take;
        w->total += take;
        off += take;
        len -= take;
    }
    return MD_OK;
}

md_status md_patch(int old_fd, int delta_fd, int out_fd, const md_options *opt, md_stats *stats,
                   md_error *err) {
    uint8_t hdr[MD_HEADER_LEN];
    md_status rc = MD_OK;
    uint32_t threads = opt && opt->threads ? opt->threads : 1;
    /* More workers than chunks per round would only add memory (see md_internal.h). */
    if (threads > MD_ROUND_CHUNKS_MAX) threads = MD_ROUND_CHUNKS_MAX;
    int64_t got = md_read_full(delta_fd, hdr, sizeof hdr);
    if (got < 0) return md_fail_io(err, errno, "reading the delta");
    if (got < (int64_t)sizeof hdr) {
        if (got >= 7 && memcmp(hdr, MD_DELTA_MAGIC, 7) != 0)
            return corrupt(err, "it is not a Meridian delta");
        return truncated(err);
    }
    if (memcmp(hdr, MD_DELTA_MAGIC, 7) != 0) return corrupt(err, "it is not a Meridian delta");
    if (MD_VERIFY_CHECKSUMS && md_get_u64(hdr + 56) != XXH3_64bits(hdr, 56))
        return corrupt(err, "its header fails its checksum");
    if (hdr[7] != 1 || md_get_u32(hdr + 8) != MD_VERSION)
        return corrupt(err, "its format version is not supported");
    if (md_get_u32(hdr + 12) != 0) return corrupt(err, "it sets unknown flags");
    uint64_t basis_len = md_get_u64(hdr + 16);

    struct stat st;
    if (fstat(old_fd, &st) != 0) return md_fail_io(err, errno, "reading OLD");
    if (!S_ISREG(st.st_mode)) return md_fail(err, MD_E_INVALID, "OLD must be a regular file.");
    if ((uint64_t)st.st_size != basis_len)
        return md_fail(err, MD_E_WRONG_BASIS,
                       "OLD is not the file this delta was made against: it has %llu bytes, "
                       "the delta expects %llu.",
                       (unsigned long long)st.st_size, (unsigned long long)basis_len);
    /* A regular output that we write from its start can be truncated back to
     * nothing, so there the basis check may run alongside the patch (see
     * basis_cursor); anywhere else (a pipe, say) it must finish before writing. */
    int rewindable;
    {
        struct stat ost;
        rewindable = fstat(out_fd, &ost) == 0 && S_ISREG(ost.st_mode) && ost.st_size == 0 &&
                     lseek(out_fd, 0, SEEK_CUR) == 0;
    }
    if (MD_VERIFY_CHECKSUMS && !rewindable) {
        uint8_t have[16];
        rc = basis_digest(old_fd, basis_len, threads, have, err);
        if (rc != MD_OK) return rc;
        if (memcmp(have, hdr + 24, 16) != 0)
            return md_fail(err, MD_E_WRONG_BASIS,
                           "OLD is not the file this delta was made against: its digest differs.");
    }

    size_t frame_cap = MD_FRAME_HDR_LEN + MD_FRAME_MAX_CMD + ZSTD_compressBound(MD_FRAME_MAX_LIT) + 8;
    uint8_t *fbuf = malloc(frame_cap);
    uint8_t *lit = malloc(MD_FRAME_MAX_LIT);
    ZSTD_DCtx *dctx = ZSTD_createDCtx();
    md_writer w = {0};
    md_digest dg = {0};
    uint64_t in_bytes = sizeof hdr;
    old_view view = {old_fd, basis_len, NULL, 0, 0, 0};
    basis_cursor bc = {0};
    bc.view = (old_view){old_fd, basis_len, NULL, 0, 0, 0};
    int ok = fbuf && lit && dctx && md_writer_init(&w, out_fd, 1 << 20) == 0 && md_digest_init(&dg) == 0;
    basis_helper helper = {0};
    helper.fd = old_fd;
    helper.len = basis_len;
    if (ok && rewindable && threads >= 2)
        helper.started = pthread_create(&helper.tid, NULL, basis_helper_main, &helper) == 0;
    if (ok && rewindable && !helper.started) {
        bc.scratch = malloc(CATCHUP_BUF);
        ok = bc.scratch && md_digest_init(&bc.dg) == 0;
        bc.on = ok;
    }
    if (!ok) {
        rc = md_fail(err, MD_E_NOMEM, "out of memory while patching.");
        goto done;
    }
    /* A regular output that we write from its start may get holes for zeros. */
    w.sparse = rewindable;
    w.durable = opt && (opt->flags & MD_DURABLE);
    for (uint64_t seq = 0;; seq++) {
        got = md_read_full(delta_fd, fbuf, MD_FRAME_HDR_LEN);
        if (got < 0) {
            rc = md_fail_io(err, errno, "reading the delta");
            goto done;
        }
        if (got < MD_FRAME_HDR_LEN) {
            rc = truncated(err);
            goto done;
        }
        /* The header has its own checksum, so a damaged length reads as corruption,
         * never as a truncated file, and is never used to size a read. */
        if (MD_VERIFY_CHECKSUMS && md_get_u64(fbuf + 24) != XXH3_64bits(fbuf, 24)) {
            rc = corrupt(err, "a frame header fails its checksum");
            goto done;
        }
        uint8_t type = fbuf[0], codec = fbuf[1];
        uint32_t cmd_len = md_get_u32(fbuf + 4), lit_raw = md_get_u32(fbuf + 8);
        uint32_t stored = md_get_u32(fbuf + 12);
        if (type != MD_FRAME_DATA && type != MD_FRAME_END) {
            rc = corrupt(err, "a frame has an unknown type");
            goto done;
        }
        if (fbuf[2] || fbuf[3] || md_get_u64(fbuf + 16) != seq) {
            rc = corrupt(err, "a frame header is malformed or out of sequence");
            goto done;
        }
        if (type == MD_FRAME_END ? (codec || cmd_len != MD_END_PAYLOAD_LEN || lit_raw || stored)
                                 : (cmd_len > MD_FRAME_MAX_CMD || lit_raw > MD_FRAME_MAX_LIT ||
                                    (codec == MD_CODEC_RAW && stored != lit_raw) ||
                                    (codec == MD_CODEC_ZSTD && (stored > ZSTD_compressBound(lit_raw) || !lit_raw)) ||
                                    codec > MD_CODEC_ZSTD)) {
            rc = corrupt(err, "a frame declares impossible lengths");
            goto done;
        }
        size_t body = (size_t)cmd_len + stored + 8;
        got = md_read_full(delta_fd, fbuf + MD_FRAME_HDR_LEN, body);
        if (got < 0) {
            rc = md_fail_io(err, errno, "reading the delta");
            goto done;
        }
        if ((size_t)got != body) {
            rc = truncated(err);
            goto done;
        }
        in_bytes += MD_FRAME_HDR_LEN + body;
        size_t sum_at = MD_FRAME_HDR_LEN + cmd_len + stored;
        if (MD_VERIFY_CHECKSUMS && md_get_u64(fbuf + sum_at) != XXH3_64bits(fbuf, sum_at)) {
            rc = corrupt(err, "a frame fails its checksum");
            goto done;
        }
        const uint8_t *cp = fbuf + MD_FRAME_HDR_LEN;
        if (type == MD_FRAME_END) {
            uint8_t digest[16], probe;
            if (bc.on) {
                rc = basis_finish(&bc, &view, basis_len, hdr + 24, err);
                if (rc != MD_OK) goto done;
            }
            if (helper.started) {
                rc = basis_helper_finish(&helper, hdr + 24, err);
                if (rc != MD_OK) goto done;
            }
            if (md_writer_finish(&w) != 0) {
                rc = md_fail_io(err, w.failed_errno, "writing the output");
                goto done;
            }
            got = md_read_full(delta_fd, &probe, 1);
            if (got != 0) {
                rc = got < 0 ? md_fail_io(err, errno, "reading the delta")
                             : corrupt(err, "it has bytes after its end marker");
                goto done;
            }
            md_digest_final(&dg, digest);
            if (md_get_u64(cp) != w.total) {
                rc = corrupt(err, "the output length differs from the one it records");
                goto done;
            }
            if (MD_VERIFY_CHECKSUMS && memcmp(digest, cp + 8, 16) != 0) {
                rc = corrupt(err, "the output digest differs from the one it records");
                goto done;
            }
            break;
        }
        const uint8_t *lp = cp + cmd_len;
        if (codec == MD_CODEC_ZSTD) {
            size_t z = ZSTD_decompressDCtx(dctx, lit, lit_raw, lp, stored);
            if (ZSTD_isError(z) || z != lit_raw) {
                rc = corrupt(err, "a literal block does not decompress");
                goto done;
            }
            lp = lit;
        }
        size_t ci = 0, lit_used = 0;
        uint64_t prev_copy_end = 0;
        while (ci < cmd_len) {
            uint64_t word, len, delta_u;
            size_t used = md_get_varint(cp + ci, cmd_len - ci, &word);
            if (!used) {
                rc = corrupt(err, "a command is malformed");
                goto done;
            }
            ci += used;
            len = word >> 1;
            if (!len) {
                rc = corrupt(err, "a command has length zero");
                goto done;
            }
            if ((word & 1) == 0) {
                if (len > lit_raw - lit_used) {
                    rc = corrupt(err, "a literal runs past its frame");
                    goto done;
                }
                md_digest_update(&dg, lp + lit_used, (size_t)len);
                if (md_writer_put(&w, lp + lit_used, (size_t)len) != 0) {
                    rc = md_fail_io(err, w.failed_errno, "writing the output");
                    goto done;
                }
                lit_used += (size_t)len;
                continue;
            }
            used = md_get_varint(cp + ci, cmd_len - ci, &delta_u);
            if (!used) {
                rc = corrupt(err, "a command is malformed");
                goto done;
            }
            ci += used;
            int64_t dlt = md_unzigzag(delta_u);
            uint64_t off = prev_copy_end + (uint64_t)dlt;
            /* off must not wrap and the copy must lie inside OLD */
            if ((dlt < 0 && (uint64_t)(-(dlt + 1)) >= prev_copy_end) ||
                (dlt > 0 && off < prev_copy_end) || off > basis_len || len > basis_len - off) {
                rc = corrupt(err, "a copy reaches outside OLD");
                goto done;
            }
            rc = copy_range(&view, off, len, &w, &dg, &bc, err);
            if (rc != MD_OK) goto done;
            prev_copy_end = off + len;
        }
        if (lit_used != lit_raw) {
            rc = corrupt(err, "a frame carries literal bytes no command uses");
            goto done;
        }
        if (opt && opt->progress) __atomic_store_n(opt->progress, in_bytes, __ATOMIC_RELAXED);
    }
    if (stats) {
        memset(stats, 0, sizeof *stats);
        stats->input_bytes = in_bytes;
        stats->output_bytes = w.total;
    }
done:
    if (rc != MD_OK && rewindable) {
        /* The deferred check has not finished: a damaged delta applied to the wrong
         * OLD is reported as the wrong basis, as the up-front check would have. */
        md_error basis_err;
        int damaged = rc == MD_E_CORRUPT_DELTA || rc == MD_E_TRUNCATED_DELTA;
        md_status brc = MD_OK;
        if (helper.started) brc = basis_helper_finish(&helper, hdr + 24, &basis_err);
        else if (bc.on && damaged) brc = basis_finish(&bc, &view, basis_len, hdr + 24, &basis_err);
        if (damaged && brc == MD_E_WRONG_BASIS) {
            rc = MD_E_WRONG_BASIS;
            if (err) *err = basis_err;
        }
        /* Leave no output behind: the file was empty when we started. */
        if (ftruncate(out_fd, 0) != 0) { /* the error already reported matters more */
        }
    }
    view_unmap(&view);
    view_unmap(&bc.view);
    free(bc.scratch);
    if (bc.dg.top) md_digest_free(&bc.dg);
    free(fbuf);
    free(lit);
    ZSTD_freeDCtx(dctx);
    md_writer_free(&w);
    md_digest_free(&dg);
    return rc;
}
