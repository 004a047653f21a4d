/* Delta: one pass over NEW in rounds of up to MD_ROUND_CHUNKS_MAX fixed 4 MiB
 * segments. Each segment is scanned on its own (in parallel); segments are then
 * stitched in order, trimming the start of a segment that the previous one's
 * last match already covered. Frames are cut by a rule that only depends on the
 * command stream, and encoded in parallel, so the delta is byte-identical for
 * any thread count. */
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

#include <xxhash.h>
#include <zstd.h>

#include "md_internal.h"

#define ZSTD_LEVEL 1
#define PROBE_LEN ((size_t)64 << 10)
#define FRAME_MAX_CMDS 32768u
#define MAX_CANDIDATES 64u

enum { CMD_LIT = 0, CMD_COPY = 1 };
typedef struct cmd {
    uint64_t pos; /* offset in NEW (literal) or OLD (copy) */
    uint64_t len;
    uint32_t kind;
} cmd;

typedef struct cmdvec {
    cmd *v;
    size_t len, cap;
    int oom;
} cmdvec;

static void cv_push(cmdvec *c, uint32_t kind, uint64_t pos, uint64_t len) {
    if (!len) return;
    if (c->len) {
        cmd *last = &c->v[c->len - 1];
        if (last->kind == kind && last->pos + last->len == pos) {
            last->len += len;
            return;
        }
    }
    if (c->len == c->cap) {
        size_t nc = c->cap ? c->cap * 2 : 64;
        cmd *nv = realloc(c->v, nc * sizeof *nv);
        if (!nv) {
            c->oom = 1;
            return;
        }
        c->v = nv;
        c->cap = nc;
    }
    c->v[c->len++] = (cmd){pos, len, kind};
}

typedef struct segment {
    uint64_t start, end;   /* file offsets of NEW scanned by this segment */
    uint64_t cover_end;    /* the commands cover [start, cover_end) */
    cmdvec cmds;
    uint8_t digest[16];
} segment;

typedef struct scan_round {
    const md_sig *sig;
    const uint8_t *buf;    /* NEW from `base` */
    uint64_t base, have;   /* bytes valid in buf */
    int at_eof;            /* buf ends at the end of NEW */
    segment *segs;
} scan_round;

static int lookup(const md_sig *sig, uint32_t s1, uint32_t s2, const uint8_t *p, uint8_t *strong,
                  int *have_strong, uint64_t *block) {
    uint64_t key = md_weak_key(s1, s2);
    uint64_t s = md_weak_mix(key) & sig->slot_mask;
    for (;;) {
        uint32_t j = sig->slots[s];
        if (j == UINT32_MAX) return 0;
        if (sig->sorted_key[j] == key) {
            if (!*have_strong) {
                md_strong(p, sig->block_len, sig->strong_len, strong);
                *have_strong = 1;
            }
            for (uint32_t c = 0; c < MAX_CANDIDATES && j < sig->n_sorted && sig->sorted_key[j] == key;
                 c++, j++) {
                uint32_t idx = sig->sorted_idx[j];
                if (memcmp(sig->strong + (size_t)idx * sig->strong_len, strong, sig->strong_len) == 0) {
                    *block = idx;
                    return 1;
                }
            }
            return 0;
        }
        s = (s + 1) & sig->slot_mask;
    }
}

/* The miss path, where nearly every byte of unrelated data goes: roll one byte,
 * test one bit of the first filter and, on a hit (under 1%), one bit of the
 * second. Kept apart so its few live values stay in registers. Returns the first
 * position in (p, end] whose sums pass both filters, or end. */
static uint64_t roll_scalar(const uint8_t *d, uint64_t p, uint64_t end, uint32_t n, uint32_t *s1p,
                            uint32_t *s2p, const md_sig *sig) {
    const uint32_t *bm = sig->bitmap;
    const uint64_t *f2 = sig->filter2;
    const unsigned shift = sig->bitmap_shift, shift2 = sig->filter2_shift;
    uint32_t s1 = *s1p, s2 = *s2p;
    const uint32_t n_off = n * MD_ROLL_OFFSET;
    const uint8_t *out = d + p, *stop = d + end;
    const uint8_t *in = out + n;
    while (out < stop) {
        uint32_t o = *out++, c = *in++;
        s1 += c - o;
        s2 += s1 - n * o - n_off;
        uint32_t bit = md_filter1(s1, s2) >> shift;
        if (__builtin_expect((bm[bit >> 5] >> (bit & 31)) & 1, 0)) {
            uint64_t bit2 = (md_weak_key(s1, s2) * MD_FILTER2_MUL) >> shift2;
            if ((f2[bit2 >> 6] >> (bit2 & 63)) & 1) break;
        }
    }
    *s1p = s1;
    *s2p = s2;
    return (uint64_t)(out - d);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define MD_HAVE_ROLL_AVX2 1
/* Inclusive prefix sum of eight 32-bit lanes. */
__attribute__((target("avx2"))) static inline __m256i prefix8(__m256i x) {
    x = _mm256_add_epi32(x, _mm256_slli_si256(x, 4));
    x = _mm256_add_epi32(x, _mm256_slli_si256(x, 8));
    return _mm256_add_epi32(x, _mm256_shuffle_epi32(_mm256_permute2x128_si256(x, x, 0x08), 0xFF));
}

/* roll_scalar for eight positions at a time: the sums of positions p+1 .. p+8 come
 * from prefix sums of the byte differences, their first-filter bits from one
 * gather, and only a lane that hits goes on to the second filter, in order, so
 * the result is exactly roll_scalar's. The running sums stay broadcast in
 * vectors, so the loop-carried chain is one add and one permute per 8 bytes. */
__attribute__((target("avx2"))) static uint64_t roll_avx2(const uint8_t *d, uint64_t p, uint64_t end,
                                                          uint32_t n, uint32_t *s1p, uint32_t *s2p,
                                                          const md_sig *sig) {
    const uint64_t *f2 = sig->filter2;
    const unsigned shift2 = sig->filter2_shift;
    const __m256i c1 = _mm256_set1_epi32((int)0x9E3779B1u), c2 = _mm256_set1_epi32((int)0x85EBCA77u);
    const __m256i vn = _mm256_set1_epi32((int)n), noff = _mm256_set1_epi32((int)(n * MD_ROLL_OFFSET));
    const __m256i m31 = _mm256_set1_epi32(31), last = _mm256_set1_epi32(7);
    const __m128i shift = _mm_cvtsi32_si128((int)sig->bitmap_shift);
    __m256i b1 = _mm256_set1_epi32((int)*s1p), b2 = _mm256_set1_epi32((int)*s2p);
    while (p + 8 <= end) {
        __m256i o = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(d + p)));
        __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(d + p + n)));
        __m256i v1 = _mm256_add_epi32(prefix8(_mm256_sub_epi32(c, o)), b1);
        __m256i t = _mm256_sub_epi32(v1, _mm256_add_epi32(_mm256_mullo_epi32(vn, o), noff));
        __m256i v2 = _mm256_add_epi32(prefix8(t), b2);
        b1 = _mm256_permutevar8x32_epi32(v1, last);
        b2 = _mm256_permutevar8x32_epi32(v2, last);
        __m256i h = _mm256_xor_si256(_mm256_mullo_epi32(v1, c1), _mm256_mullo_epi32(v2, c2));
        h = _mm256_srl_epi32(h, shift);
        __m256i w = _mm256_i32gather_epi32((const int *)(const void *)sig->bitmap, _mm256_srli_epi32(h, 5), 4);
        /* move each lane's bit to its sign bit */
        w = _mm256_sllv_epi32(w, _mm256_sub_epi32(m31, _mm256_and_si256(h, m31)));
        unsigned mask = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(w));
        if (__builtin_expect(mask != 0, 0)) {
            uint32_t a1[8], a2[8];
            _mm256_storeu_si256((__m256i *)(void *)a1, v1);
            _mm256_storeu_si256((__m256i *)(void *)a2, v2);
            while (mask) {
                unsigned k = (unsigned)__builtin_ctz(mask);
                mask &= mask - 1;
                uint64_t bit2 = (md_weak_key(a1[k], a2[k]) * MD_FILTER2_MUL) >> shift2;
                if ((f2[bit2 >> 6] >> (bit2 & 63)) & 1) {
                    *s1p = a1[k];
                    *s2p = a2[k];
                    return p + k + 1;
                }
            }
        }
        p += 8;
    }
    *s1p = (uint32_t)_mm256_cvtsi256_si32(b1);
    *s2p = (uint32_t)_mm256_cvtsi256_si32(b2);
    return roll_scalar(d, p, end, n, s1p, s2p, sig);
}
#else
#define MD_HAVE_ROLL_AVX2 0
#endif

static uint64_t roll_until_hit(const uint8_t *d, uint64_t p, uint64_t end, uint32_t n, uint32_t *s1p,
                               uint32_t *s2p, const md_sig *sig) {
#if MD_HAVE_ROLL_AVX2
    if (md_cpu_avx2()) return roll_avx2(d, p, end, n, s1p, s2p, sig);
#endif
    return roll_scalar(d, p, end, n, s1p, s2p, sig);
}

static void scan_task(void *arg, size_t i, uint32_t worker) {
    (void)worker;
    scan_round *r = arg;
    segment *sg = &r->segs[i];
    const md_sig *sig = r->sig;
    const uint8_t *d = r->buf;
    const uint64_t n = sig->block_len;
    const uint64_t full_blocks = sig->file_len / n;
    const uint32_t *bm = sig->bitmap;
    const unsigned shift = sig->bitmap_shift;
    uint64_t s = sg->start - r->base, e = sg->end - r->base, L = r->have;
    uint64_t p = s, lit = s, expected = UINT64_MAX;
    uint32_t s1 = 0, s2 = 0;
    uint8_t strong[16];

    md_chunk_digest(d + s, (size_t)(e - s), sg->digest);
    sg->cmds.len = 0;
    if (full_blocks == 0 || p + n > L) goto finish;
    md_weak_block(d + p, (size_t)n, &s1, &s2);
    for (;;) {
        /* invariant: p < e, p + n <= L, (s1, s2) are the sums of d[p, p + n) */
        uint64_t found = UINT64_MAX;
        int have_strong = 0;
        if (expected < full_blocks && sig->s1[expected] == s1 && sig->s2[expected] == s2) {
            md_strong(d + p, (size_t)n, sig->strong_len, strong);
            have_strong = 1;
            if (memcmp(sig->strong + expected * sig->strong_len, strong, sig->strong_len) == 0)
                found = expected;
        }
        if (found == UINT64_MAX) {
            uint32_t bit = md_filter1(s1, s2) >> shift;
            uint64_t blk;
            if (((bm[bit >> 5] >> (bit & 31)) & 1) &&
                lookup(sig, s1, s2, d + p, strong, &have_strong, &blk))
                found = blk;
        }
        if (found != UINT64_MAX) {
            cv_push(&sg->cmds, CMD_LIT, r->base + lit, p - lit);
            cv_push(&sg->cmds, CMD_COPY, found * n, n);
            p += n;
            lit = p;
            expected = found + 1;
            if (p >= e || p + n > L) break;
            md_weak_block(d + p, (size_t)n, &s1, &s2);
            continue;
        }
        expected = UINT64_MAX;
        /* The miss path: roll and test the bitmap until something might match. */
        uint64_t roll_end = e < L - n ? e : L - n; /* positions that can roll one byte on */
        if (p >= roll_end) {
            p++;
            break;
        }
        p = roll_until_hit(d, p, roll_end, (uint32_t)n, &s1, &s2, sig);
        if (p >= e) break;
    }
finish:
    if (p < e) p = e;
    if (lit < e) {
        cv_push(&sg->cmds, CMD_LIT, r->base + lit, e - lit);
        lit = e;
    }
    /* The short tail block of OLD can only match at the very end of NEW. */
    uint64_t tail = sig->file_len % n;
    if (r->at_eof && r->base + L == sg->end && tail && sg->cmds.len) {
        cmd *last = &sg->cmds.v[sg->cmds.len - 1];
        uint64_t new_end = sg->end;
        if (last->kind == CMD_LIT && last->len >= tail && new_end - tail >= sg->start) {
            uint64_t b = sig->block_count - 1;
            const uint8_t *tp = d + (new_end - tail - r->base);
            uint32_t t1, t2;
            md_weak_block(tp, (size_t)tail, &t1, &t2);
            if (t1 == sig->s1[b] && t2 == sig->s2[b]) {
                md_strong(tp, (size_t)tail, sig->strong_len, strong);
                if (memcmp(sig->strong + b * sig->strong_len, strong, sig->strong_len) == 0) {
                    last->len -= tail;
                    if (!last->len) sg->cmds.len--;
                    cv_push(&sg->cmds, CMD_COPY, b * n, tail);
                }
            }
        }
    }
    sg->cover_end = r->base + (lit > p ? lit : p);
}

/* ---------------- frames ---------------- */

typedef struct frame {
    cmdvec cmds;      /* literal cmds here have pos = offset into lit */
    uint8_t *lit;
    uint32_t lit_len;
    uint8_t *out;     /* encoded frame */
    size_t out_len, out_cap;
    int failed;
} frame;

/* Written frames are kept for reuse: a fresh 1 MiB buffer per frame would cost
 * a page fault and a page clear for every 4 KiB of literals. */
#define FRAME_SPARES 32u
typedef struct framer {
    frame *open;
    frame **closed;
    size_t n_closed, cap_closed;
    int oom;
    uint64_t seq;
    frame *spare[FRAME_SPARES];
    size_t n_spare;
} framer;

static frame *frame_new(void) {
    frame *f = calloc(1, sizeof *f);
    if (f) f->lit = malloc(MD_FRAME_MAX_LIT);
    if (f && !f->lit) {
        free(f);
        f = NULL;
    }
    return f;
}

static void frame_free(frame *f) {
    if (!f) return;
    free(f->cmds.v);
    free(f->lit);
    free(f->out);
    free(f);
}

static void framer_close(framer *fr) {
    if (!fr->open) return;
    if (fr->n_closed == fr->cap_closed) {
        size_t nc = fr->cap_closed ? fr->cap_closed * 2 : 16;
        frame **nv = realloc(fr->closed, nc * sizeof *nv);
        if (!nv) {
            fr->oom = 1;
            return;
        }
        fr->closed = nv;
        fr->cap_closed = nc;
    }
    fr->closed[fr->n_closed++] = fr->open;
    fr->open = NULL;
}

static void framer_recycle(framer *fr, frame *f) {
    if (fr->n_spare == FRAME_SPARES) {
        frame_free(f);
        return;
    }
    f->cmds.len = 0;
    f->cmds.oom = 0;
    f->lit_len = 0;
    f->out_len = 0;
    f->failed = 0;
    fr->spare[fr->n_spare++] = f;
}

static frame *framer_frame(framer *fr) {
    if (!fr->open) fr->open = fr->n_spare ? fr->spare[--fr->n_spare] : frame_new();
    if (!fr->open) fr->oom = 1;
    return fr->open;
}

static void framer_copy(framer *fr, uint64_t off, uint64_t len) {
    frame *f = framer_frame(fr);
    if (!f) return;
    cmdvec *c = &f->cmds;
    if (c->len && c->v[c->len - 1].kind == CMD_COPY && c->v[c->len - 1].pos + c->v[c->len - 1].len == off) {
        c->v[c->len - 1].len += len;
        return;
    }
    if (c->len >= FRAME_MAX_CMDS) {
        framer_close(fr);
        f = framer_frame(fr);
        if (!f) return;
        c = &f->cmds;
    }
    cv_push(c, CMD_COPY, off, len);
    if (c->oom) fr->oom = 1;
}

static void framer_literal(framer *fr, const uint8_t *p, uint64_t len) {
    while (len) {
        frame *f = framer_frame(fr);
        if (!f) return;
        if (f->lit_len == MD_FRAME_MAX_LIT || f->cmds.len >= FRAME_MAX_CMDS) {
            framer_close(fr);
            if (fr->oom) return;
            continue;
        }
        uint64_t room = MD_FRAME_MAX_LIT - f->lit_len;
        uint32_t take = (uint32_t)(len < room ? len : room);
        memcpy(f->lit + f->lit_len, p, take);
        cv_push(&f->cmds, CMD_LIT, f->lit_len, take);
        if (f->cmds.oom) fr->oom = 1;
        f->lit_len += take;
        p += take;
        len -= take;
    }
}

typedef struct encode_ctx {
    const md_sig *sig;
    frame **frames;
    uint64_t first_seq;
    ZSTD_CCtx **cctx;
    uint8_t **probe;
} encode_ctx;

static void encode_task(void *arg, size_t i, uint32_t worker) {
    encode_ctx *x = arg;
    frame *f = x->frames[i];
    size_t bound = ZSTD_compressBound(f->lit_len);
    size_t cap = MD_FRAME_HDR_LEN + f->cmds.len * 21 + (bound > f->lit_len ? bound : f->lit_len) + 8;
    if (f->out_cap < cap) {
        free(f->out);
        f->out = malloc(cap);
        f->out_cap = f->out ? cap : 0;
    }
    if (!f->out) {
        f->failed = 1;
        return;
    }
    uint8_t *o = f->out, *cp = o + MD_FRAME_HDR_LEN;
    uint64_t prev_copy_end = 0;
    /* The basis check: copies are whole blocks of the signature (md_delta makes them
     * so), whose strong hashes are the piece hashes FORMAT.md chains. */
    const md_sig *sig = x->sig;
    uint64_t check = x->first_seq + i;
    for (size_t k = 0; k < f->cmds.len; k++) {
        const cmd *c = &f->cmds.v[k];
        cp += md_put_varint(cp, (c->len << 1) | c->kind);
        if (c->kind == CMD_COPY) {
            cp += md_put_varint(cp, md_zigzag((int64_t)(c->pos - prev_copy_end)));
            prev_copy_end = c->pos + c->len;
            for (uint64_t b = c->pos / sig->block_len; b * sig->block_len < prev_copy_end; b++)
                check = md_ph_chain(check, sig->strong + b * sig->strong_len, sig->strong_len);
        }
    }
    uint32_t cmd_len = (uint32_t)(cp - (o + MD_FRAME_HDR_LEN));
    uint8_t codec = MD_CODEC_RAW;
    size_t stored = f->lit_len;
    if (f->lit_len) {
        /* Probe a slice first: random data would cost a full compression pass
         * for nothing. */
        int worth = 1;
        if (f->lit_len > 2 * PROBE_LEN) {
            size_t pr = ZSTD_compressCCtx(x->cctx[worker], x->probe[worker],
                                          ZSTD_compressBound(PROBE_LEN), f->lit, PROBE_LEN, ZSTD_LEVEL);
            worth = !ZSTD_isError(pr) && pr < PROBE_LEN - PROBE_LEN / 32;
        }
        size_t z = worth ? ZSTD_compressCCtx(x->cctx[worker], cp, bound, f->lit, f->lit_len, ZSTD_LEVEL)
                         : 0;
        if (worth && !ZSTD_isError(z) && z < f->lit_len) {
            codec = MD_CODEC_ZSTD;
            stored = z;
        } else {
            memcpy(cp, f->lit, f->lit_len);
        }
    }
    f->out_len = md_frame_seal(o, MD_FRAME_DATA, codec, 0, cmd_len, f->lit_len, (uint32_t)stored,
                               x->first_seq + i, check);
}

static md_status flush_closed(const md_sig *sig, framer *fr, uint32_t threads, ZSTD_CCtx **cctx, uint8_t **probe,
                              md_writer *w, md_error *err) {
    md_status rc = MD_OK;
    if (!fr->n_closed) return MD_OK;
    encode_ctx x = {sig, fr->closed, fr->seq, cctx, probe};
    md_parallel_for(threads, fr->n_closed, encode_task, &x);
    for (size_t i = 0; i < fr->n_closed; i++) {
        frame *f = fr->closed[i];
        if (rc == MD_OK && f->failed) rc = md_fail(err, MD_E_NOMEM, "out of memory while writing a delta.");
        if (rc == MD_OK && md_writer_put(w, f->out, f->out_len) != 0)
            rc = md_fail_io(err, w->failed_errno, "writing the delta");
        framer_recycle(fr, f);
    }
    fr->seq += fr->n_closed;
    fr->n_closed = 0;
    return rc;
}

md_status md_delta(int sig_fd, int new_fd, int delta_fd, const md_options *opt, md_stats *stats,
                   md_error *err) {
    md_sig *sig = NULL;
    uint32_t threads;
    md_status rc = md_begin(opt, &threads, err);
    if (rc != MD_OK) return rc;
    rc = md_sig_load(sig_fd, &sig, err);
    if (rc != MD_OK) return rc;
    rc = md_sig_index(sig, err);
    if (rc != MD_OK) {
        md_sig_free(sig);
        return rc;
    }
    uint32_t k = threads < MD_ROUND_CHUNKS_MAX ? threads : MD_ROUND_CHUNKS_MAX;
    uint64_t n = sig->block_len;
    uint64_t round_bytes = (uint64_t)k * MD_CHUNK_LEN;
    size_t buf_cap = (size_t)(round_bytes + n);
    uint8_t *buf = malloc(buf_cap);
    segment *segs = calloc(k, sizeof *segs);
    ZSTD_CCtx *cctx[MD_MAX_THREADS] = {0};
    uint8_t *probe[MD_MAX_THREADS] = {0};
    framer fr = {0};
    md_writer w = {0};
    md_digest dg = {0};
    uint64_t copy_bytes = 0, literal_bytes = 0;
    int ok = buf && segs && md_writer_init(&w, delta_fd, 1 << 20) == 0 && md_digest_init(&dg) == 0;
    for (uint32_t t = 0; ok && t < threads; t++) {
        cctx[t] = ZSTD_createCCtx();
        probe[t] = malloc(ZSTD_compressBound(PROBE_LEN));
        ok = cctx[t] && probe[t];
    }
    if (!ok) {
        rc = md_fail(err, MD_E_NOMEM, "out of memory while making a delta.");
        goto done;
    }
    uint8_t hdr[MD_HEADER_LEN];
    md_delta_header(hdr, sig->file_len, sig->digest, sig->block_len, sig->strong_len);
    md_writer_put(&w, hdr, sizeof hdr);

    uint64_t base = 0, have = 0, covered = 0;
    int at_eof = 0;
    for (;;) {
        if (md_cancelled(opt)) {
            rc = md_fail(err, MD_E_CANCELLED, "the delta was cancelled.");
            goto done;
        }
        if (!at_eof && have < round_bytes + n) {
            int64_t got = md_read_full(new_fd, buf + have, (size_t)(round_bytes + n - have));
            if (got < 0) {
                rc = md_fail_io(err, errno, "reading NEW");
                goto done;
            }
            have += (uint64_t)got;
            at_eof = have < round_bytes + n;
        }
        if (have == 0) break;
        uint64_t round_len = have < round_bytes ? have : round_bytes;
        if (!at_eof || have > round_bytes) round_len = round_bytes;
        size_t nseg = (size_t)((round_len + MD_CHUNK_LEN - 1) / MD_CHUNK_LEN);
        for (size_t i = 0; i < nseg; i++) {
            segs[i].start = base + i * MD_CHUNK_LEN;
            segs[i].end = segs[i].start + MD_CHUNK_LEN;
            if (segs[i].end > base + round_len) segs[i].end = base + round_len;
        }
        scan_round sr = {sig, buf, base, have, at_eof && have <= round_bytes, segs};
        md_parallel_for(threads, nseg, scan_task, &sr);
        for (size_t i = 0; i < nseg; i++) {
            segment *sg = &segs[i];
            if (sg->cmds.oom) {
                rc = md_fail(err, MD_E_NOMEM, "out of memory while making a delta.");
                goto done;
            }
            md_digest_add_chunk(&dg, sg->digest, sg->end - sg->start);
            uint64_t at = sg->start;
            for (size_t j = 0; j < sg->cmds.len; j++) {
                cmd c = sg->cmds.v[j];
                if (at + c.len <= covered) {
                    at += c.len;
                    continue;
                }
                if (at < covered) { /* the previous segment's last copy ran into this one */
                    uint64_t cut = covered - at;
                    c.pos += cut;
                    c.len -= cut;
                    at = covered;
                    /* A copy must stay whole blocks (its basis check is made of the
                     * signature's block hashes): the part block goes as literal. */
                    uint64_t part = c.kind == CMD_COPY ? c.pos % n : 0;
                    if (part) {
                        uint64_t head = n - part < c.len ? n - part : c.len;
                        framer_literal(&fr, buf + (at - base), head);
                        literal_bytes += head;
                        c.pos += head;
                        c.len -= head;
                        at += head;
                        if (!c.len) continue;
                    }
                }
                if (c.kind == CMD_COPY) {
                    framer_copy(&fr, c.pos, c.len);
                    copy_bytes += c.len;
                } else {
                    framer_literal(&fr, buf + (c.pos - base), c.len);
                    literal_bytes += c.len;
                }
                at += c.len;
            }
            if (at > covered) covered = at;
        }
        if (fr.oom) {
            rc = md_fail(err, MD_E_NOMEM, "out of memory while making a delta.");
            goto done;
        }
        rc = flush_closed(sig, &fr, threads, cctx, probe, &w, err);
        if (rc != MD_OK) goto done;
        if (opt && opt->progress) __atomic_store_n(opt->progress, base + round_len, __ATOMIC_RELAXED);
        memmove(buf, buf + round_len, (size_t)(have - round_len));
        have -= round_len;
        base += round_len;
    }
    framer_close(&fr);
    rc = flush_closed(sig, &fr, threads, cctx, probe, &w, err);
    if (rc != MD_OK) goto done;
    {
        uint8_t end[MD_END_FRAME_LEN], digest[16];
        md_digest_final(&dg, digest);
        md_end_frame(end, fr.seq, base, digest);
        md_writer_put(&w, end, sizeof end);
    }
    if (md_writer_flush(&w) != 0) {
        rc = md_fail_io(err, w.failed_errno, "writing the delta");
        goto done;
    }
    if (stats) {
        memset(stats, 0, sizeof *stats);
        stats->input_bytes = base;
        stats->output_bytes = w.total;
        stats->copy_bytes = copy_bytes;
        stats->literal_bytes = literal_bytes;
        stats->block_len = sig->block_len;
        stats->strong_len = sig->strong_len;
        stats->threads = threads;
    }
done:
    for (size_t i = 0; i < fr.n_closed; i++) frame_free(fr.closed[i]);
    frame_free(fr.open);
    for (size_t i = 0; i < fr.n_spare; i++) frame_free(fr.spare[i]);
    free(fr.closed);
    for (uint32_t t = 0; t < threads; t++) {
        ZSTD_freeCCtx(cctx[t]);
        free(probe[t]);
    }
    if (segs)
        for (uint32_t i = 0; i < k; i++) free(segs[i].cmds.v);
    free(segs);
    free(buf);
    md_writer_free(&w);
    md_digest_free(&dg);
    md_sig_free(sig);
    return rc;
}
