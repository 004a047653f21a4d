/* md_delta_basis: the delta with OLD itself at hand (the sender still holds the
 * receiver's version), so it can model numbers instead of matching blocks.
 *
 * NEW is cut into regions: where a tensor of NEW lines up with one of OLD (same
 * name, element size and length in safetensors files; or, with opt->elem_width,
 * the same offset of a raw file) the region is "numeric", elsewhere "plain". Each
 * region is cut into chunks of at most 1 MiB, and each chunk becomes whichever of
 * these writes fewest bytes: a copy (its bytes equal OLD's), a NUMERIC frame
 * (zigzag integer differences in byte planes, each plane zstd-coded or raw), or a
 * literal frame. Chunks are encoded in parallel, in batches, and stitched in
 * order; every choice depends on the chunk alone, so the delta is byte-identical
 * for any thread count. Without a numeric model (neither file is safetensors and no
 * element width was given) it is md_delta against an in-memory signature of OLD. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>
#include <zstd.h>

#include "md_internal.h"

#define CHUNK ((uint64_t)1 << 20)
#define BATCH 8u
#define ZLEVEL 1     /* numeric planes: level 1 is both faster and smaller than 3 on them */
#define ZLEVEL_LIT 3 /* literal chunks (new tensors, headers): rare, so worth level 3 */
/* Planes are mostly noise (low mantissa bytes) or mostly zeros (high bytes): matches
 * are rare and short, so small match tables (hashLog 10, minMatch 7) lose nothing
 * and stay in cache; a plane whose byte entropy is above this many bits per byte
 * cannot shrink by more than ~1% and is stored raw without trying. */
#define PLANE_HASH_LOG 10
#define PLANE_MIN_MATCH 7
#define ZSTD_SAMPLE ((size_t)64 << 10)
#define RAW_ABOVE_BITS 7.92
#define RAW_SAMPLE ((size_t)16 << 10)
/* The literal coding is tried too only when the numeric one saves less than this
 * share of the chunk: it almost never wins otherwise, and costs a compression. */
#define TRY_LITERAL_ABOVE 0.85
#define LIT_SAMPLE_RUNS 4u
#define LIT_SAMPLE_RUN ((size_t)8 << 10)
#define LIT_SAMPLE_MARGIN 1.03
#define PIECE_LEN MD_MAX_BLOCK_LEN
#define PIECE_HASH 16u
#define FRAME_MAX_CMDS 32768u

enum { K_COPY, K_LITERAL, K_NUMERIC };

typedef struct region {
    uint64_t new_off, len, old_off;
    uint32_t width; /* numeric when nonzero */
    int has_old;    /* plain: OLD[new_off, +len) exists to compare with */
    int zero;       /* numeric against zeros: a tensor OLD does not have (byte planes of NEW) */
} region;

typedef struct chunk {
    uint64_t new_off, old_off, len;
    uint32_t width;
    int has_old, zero;
    /* result */
    int kind;
    int failed; /* md_status */
    uint8_t *out; /* frame bytes, header left for the stitcher */
    size_t out_cap;
    uint32_t cmd_len, stored;
    uint8_t codec, param;
    uint8_t pieces[2][PIECE_HASH]; /* hashes of the OLD range, cut at PIECE_LEN */
    unsigned n_pieces;
    uint8_t *nw; /* the chunk of NEW, kept for NEW's digest, taken in order */
} chunk;

typedef struct worker_buf {
    uint8_t *old, *planes, *lit;
    uint8_t *renc; /* the planes' rANS codes, plane k at k * plane size */
    ZSTD_CCtx *cctx;   /* literals */
    ZSTD_CCtx *pctx;   /* planes: the parameters above */
} worker_buf;

typedef struct batch_ctx {
    int old_fd, new_fd;
    chunk *chunks;
    worker_buf *wb;
} batch_ctx;

/* Byte counts of a plane. Eight histograms, so that a run of one byte value (the
 * high planes are mostly zeros) increments eight different counters in turn instead
 * of waiting on one counter's store, eight bytes loaded as one word. */
static void histogram_all(const uint8_t *p, size_t n, uint32_t out[256]) {
    uint32_t h[8][256];
    memset(h, 0, sizeof h);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t v;
        memcpy(&v, p + i, 8);
        h[0][v & 0xff]++;
        h[1][(v >> 8) & 0xff]++;
        h[2][(v >> 16) & 0xff]++;
        h[3][(v >> 24) & 0xff]++;
        h[4][(v >> 32) & 0xff]++;
        h[5][(v >> 40) & 0xff]++;
        h[6][(v >> 48) & 0xff]++;
        h[7][v >> 56]++;
    }
    for (; i < n; i++) h[0][p[i]]++;
    for (int b = 0; b < 256; b++)
        out[b] = h[0][b] + h[1][b] + h[2][b] + h[3][b] + h[4][b] + h[5][b] + h[6][b] + h[7][b];
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define MD_HIST_AVX2 1
/* A plane that is nearly all one byte value d (the high planes of small changes):
 * 32 bytes compared with d at once, d counted by popcount, and only the other bytes
 * counted one by one. The same counts as histogram_all, at 3-6x its speed there. */
__attribute__((target("avx2,popcnt,bmi"))) static void histogram_sparse(const uint8_t *p, size_t n, uint8_t d,
                                                                         uint32_t out[256]) {
    memset(out, 0, 256 * sizeof *out);
    const __m256i dv = _mm256_set1_epi8((char)d);
    size_t i = 0, same = 0;
    for (; i + 32 <= n; i += 32) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(p + i));
        uint32_t other = ~(uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(v, dv));
        same += 32 - (size_t)__builtin_popcount(other);
        while (other) {
            out[p[i + (unsigned)__builtin_ctz(other)]]++;
            other &= other - 1;
        }
    }
    for (; i < n; i++) out[p[i]]++;
    out[d] += (uint32_t)same;
}

/* The same, 64 bytes at a time (AVX-512 BW): the same counts. */
__attribute__((target("avx512f,avx512bw,popcnt,bmi"))) static void histogram_sparse64(const uint8_t *p, size_t n,
                                                                                       uint8_t d,
                                                                                       uint32_t out[256]) {
    memset(out, 0, 256 * sizeof *out);
    const __m512i dv = _mm512_set1_epi8((char)d);
    size_t i = 0, same = 0;
    for (; i + 64 <= n; i += 64) {
        uint64_t other = _mm512_cmpneq_epi8_mask(_mm512_loadu_si512((const void *)(p + i)), dv);
        same += 64 - (size_t)__builtin_popcountll(other);
        while (other) {
            out[p[i + (unsigned)__builtin_ctzll(other)]]++;
            other &= other - 1;
        }
    }
    for (; i < n; i++) out[p[i]]++;
    out[d] += (uint32_t)same;
}
#endif

/* The byte counts of one 64-byte run in every four (a quarter of the plane). */
static void histogram_quarter(const uint8_t *p, size_t n, uint32_t out[256]) {
    uint32_t h[8][256];
    memset(h, 0, sizeof h);
    for (size_t r = 0; r + 64 <= n; r += 256)
        for (size_t i = r; i < r + 64; i += 8) {
            uint64_t v;
            memcpy(&v, p + i, 8);
            h[0][v & 0xff]++;
            h[1][(v >> 8) & 0xff]++;
            h[2][(v >> 16) & 0xff]++;
            h[3][(v >> 24) & 0xff]++;
            h[4][(v >> 32) & 0xff]++;
            h[5][(v >> 40) & 0xff]++;
            h[6][(v >> 48) & 0xff]++;
            h[7][v >> 56]++;
        }
    for (int b = 0; b < 256; b++)
        out[b] = h[0][b] + h[1][b] + h[2][b] + h[3][b] + h[4][b] + h[5][b] + h[6][b] + h[7][b];
}

/* Byte counts of a plane, for its rANS frequencies: exact, or (a large plane in
 * which a quarter already holds every byte value) the quarter's, whose scaled
 * frequencies cost ~0.002 bit a byte more (no value is missing from them, the one
 * thing the coder needs). Returns the counts' total. */
static size_t histogram(const uint8_t *p, size_t n, uint32_t out[256]) {
#if MD_HIST_AVX2
    /* One byte value over 7/8 of a 1 KiB sample takes the sparse count. */
    if (n >= 4096 && md_cpu_avx2()) {
        uint32_t s[256] = {0}, top = 0;
        uint8_t d = 0;
        for (size_t i = 0; i < 1024; i++) s[p[i * (n / 1024)]]++;
        for (int b = 0; b < 256; b++)
            if (s[b] > top) {
                top = s[b];
                d = (uint8_t)b;
            }
        if (top >= 896) {
            if (md_cpu_avx512()) histogram_sparse64(p, n, d, out);
            else histogram_sparse(p, n, d, out);
            return n;
        }
    }
#endif
    if (n >= 4 * RAW_SAMPLE) {
        histogram_quarter(p, n, out);
        size_t total = 0, present = 0;
        for (int b = 0; b < 256; b++) {
            total += out[b];
            present += out[b] != 0;
        }
        if (present == 256) return total;
    }
    histogram_all(p, n, out);
    return n;
}

/* Order-0 entropy, bits per byte. */
static double entropy(const uint32_t count[256], size_t n) {
    double e = 0;
    for (int b = 0; b < 256; b++)
        if (count[b]) e -= (double)count[b] * log2((double)count[b] / (double)n);
    return n ? e / (double)n : 0;
}

/* The order-0 entropy of RAW_SAMPLE bytes of p spread evenly over it, 64 bytes at a
 * time (whole cache lines). */
static double sample_entropy(const uint8_t *p, size_t n) {
    uint32_t c[4][256];
    memset(c, 0, sizeof c);
    size_t runs = RAW_SAMPLE / 64, step = n / runs;
    for (size_t r = 0; r < runs; r++) {
        const uint8_t *q = p + r * step;
        for (size_t i = 0; i < 64; i += 4) {
            c[0][q[i]]++;
            c[1][q[i + 1]]++;
            c[2][q[i + 2]]++;
            c[3][q[i + 3]]++;
        }
    }
    for (int b = 0; b < 256; b++) c[0][b] += c[1][b] + c[2][b] + c[3][b];
    return entropy(c[0], runs * 64);
}

static void hash_pieces(chunk *c, const uint8_t *old) {
    uint64_t off = c->old_off, end = c->old_off + c->len;
    c->n_pieces = 0;
    while (off < end) {
        uint64_t cut = (off / PIECE_LEN + 1) * PIECE_LEN;
        if (cut > end) cut = end;
        md_h128(old + (off - c->old_off), (size_t)(cut - off), c->pieces[c->n_pieces++]);
        off = cut;
    }
}

static int read_exact(int fd, uint8_t *buf, uint64_t len, uint64_t off) {
    int64_t got = md_pread_full(fd, buf, (size_t)len, off);
    if (got < 0) return -1;
    return (uint64_t)got == len ? 0 : 1;
}

/* A literal frame body: one LITERAL command, then the bytes (zstd or raw). */
static void encode_literal(chunk *c, const uint8_t *nw, ZSTD_CCtx *cctx) {
    uint8_t *cp = c->out + MD_FRAME_HDR_LEN;
    c->cmd_len = (uint32_t)md_put_varint(cp, c->len << 1);
    uint8_t *lp = cp + c->cmd_len;
    size_t z = ZSTD_compressCCtx(cctx, lp, ZSTD_compressBound((size_t)c->len), nw, (size_t)c->len, ZLEVEL_LIT);
    if (!ZSTD_isError(z) && z < c->len) {
        c->codec = MD_CODEC_ZSTD;
        c->stored = (uint32_t)z;
    } else {
        memcpy(lp, nw, (size_t)c->len);
        c->codec = MD_CODEC_RAW;
        c->stored = (uint32_t)c->len;
    }
    c->param = 0;
    c->kind = K_LITERAL;
}

/* A numeric frame body: u64 OLD offset, u32 stored size of each plane, the planes.
 * Each plane goes as whichever of raw, rANS and zstd is smallest: its codec byte,
 * then its bytes. rANS codes near the entropy; zstd is tried as well only where runs
 * are likely (one byte value above 90% of the plane), since LZ matches can beat
 * order-0 coding there. The planes rANS codes are coded two at a time into `renc`
 * (md_rans16_encode2 overlaps their work), then each is placed. */
static size_t encode_numeric(chunk *c, const worker_buf *b) {
    unsigned w = c->width, log2w = w == 8 ? 3 : w == 4 ? 2 : w == 2 ? 1 : 0;
    size_t plane = (size_t)c->len / w;
    uint8_t *cp = c->out + MD_FRAME_HDR_LEN;
    md_num_encode(b->old, c->nw, (size_t)c->len, w, b->planes);
    md_put_u64(cp, c->old_off);
    uint32_t count[8][256], top[8];
    double bits[8];
    size_t rsize[8] = {0};
    /* 64 states (codec 4) decode ~2x faster than 32 (codec 3) on a large plane;
     * on a small one their 128 more bytes of states would show */
    unsigned lanes = plane >= MD_RANS64_MIN ? 64 : 32;
    uint8_t rcodec = lanes == 64 ? MD_PLANE_RANS64 : MD_PLANE_RANS16;
    int pending = -1;
    for (unsigned k = 0; k < w; k++) {
        const uint8_t *src = b->planes + k * plane;
        /* A noisy plane (the low mantissa bytes) goes raw: a sample that says so
         * spares its full count, a fifth of a diff where half the planes are noise.
         * The sample's entropy is below the plane's (by ~0.01 bit for a uniform
         * plane of this sample size), so a plane it calls noisy is. */
        if (plane >= 4 * RAW_SAMPLE && sample_entropy(src, plane) > RAW_ABOVE_BITS) {
            bits[k] = 8;
            top[k] = 0;
            continue;
        }
        size_t total = histogram(src, plane, count[k]);
        top[k] = 0;
        for (int s = 0; s < 256; s++)
            if (count[k][s] > top[k]) top[k] = count[k][s];
        top[k] = (uint32_t)((uint64_t)top[k] * plane / total);
        bits[k] = entropy(count[k], total);
        if (bits[k] > RAW_ABOVE_BITS) continue;
        if (pending < 0) {
            pending = (int)k;
            continue;
        }
        unsigned j = (unsigned)pending;
        md_rans16_encode2(b->planes + j * plane, count[j], b->renc + j * plane, &rsize[j], src, count[k],
                          b->renc + k * plane, &rsize[k], plane, plane, lanes);
        pending = -1;
    }
    if (pending >= 0)
        rsize[pending] = md_rans16_encode(b->planes + (size_t)pending * plane, plane, count[pending],
                                          b->renc + (size_t)pending * plane, plane, lanes);
    uint8_t *sp = cp + 8 + 4 * w;
    size_t total = 0;
    for (unsigned k = 0; k < w; k++) {
        const uint8_t *src = b->planes + k * plane, *from = src;
        size_t best = plane;
        uint8_t codec = MD_PLANE_RAW;
        if (bits[k] <= RAW_ABOVE_BITS) {
            if (rsize[k] && rsize[k] < best) {
                best = rsize[k];
                codec = rcodec;
                from = b->renc + k * plane;
            }
            /* zstd pays only where runs beat order-0 coding, rarely on a large plane:
             * a sample of its first ZSTD_SAMPLE bytes decides whether to try it in
             * full (a plane no longer than that is tried outright). */
            int try_zstd = top[k] > plane / 10 * 9;
            if (try_zstd && plane > ZSTD_SAMPLE) {
                size_t z = ZSTD_compress2(b->pctx, b->lit, ZSTD_compressBound(ZSTD_SAMPLE), src, ZSTD_SAMPLE);
                try_zstd = !ZSTD_isError(z) && (double)z < 0.97 * bits[k] * ZSTD_SAMPLE / 8;
            }
            if (try_zstd) {
                size_t z = ZSTD_compress2(b->pctx, b->lit, ZSTD_compressBound(plane), src, plane);
                if (!ZSTD_isError(z) && z < best) {
                    best = z;
                    codec = MD_PLANE_ZSTD;
                    from = b->lit;
                }
            }
        }
        memcpy(sp + 1, from, best);
        sp[0] = codec;
        md_put_u32(cp + 8 + 4 * k, (uint32_t)(1 + best));
        sp += 1 + best;
        total += 1 + best;
    }
    c->cmd_len = 8 + 4 * w;
    c->stored = (uint32_t)total;
    c->codec = 0;
    c->param = (uint8_t)log2w;
    c->kind = K_NUMERIC;
    return total + c->cmd_len;
}

/* What a literal frame of the chunk (zstd level ZLEVEL_LIT) would store, to compare
 * with a numeric frame of `rival` bytes; c->len when it would not be smaller. A
 * chunk over 4 LIT_SAMPLE_RUN bytes is first sampled (LIT_SAMPLE_RUNS runs spread
 * evenly, copied into b->old, which the caller no longer needs): a numeric frame
 * that saves too little to skip this is mostly a tensor that moved by more than
 * its own magnitude, where the literal lost by 8-10% on every 1 MiB chunk of the
 * checkpoint series and its full compression was a fifth of the diff. The full
 * compression runs only when the sample's size, scaled to the chunk, is within
 * LIT_SAMPLE_MARGIN of the rival (a sample sees fewer long matches than the whole,
 * so it errs towards the literal's cost being too high: the margin covers that). */
static size_t literal_cost(const chunk *c, const worker_buf *b, size_t rival) {
    size_t len = (size_t)c->len;
    if (len > LIT_SAMPLE_RUNS * LIT_SAMPLE_RUN * 4) {
        size_t step = len / LIT_SAMPLE_RUNS, n = LIT_SAMPLE_RUNS * LIT_SAMPLE_RUN;
        for (size_t r = 0; r < LIT_SAMPLE_RUNS; r++)
            memcpy(b->old + r * LIT_SAMPLE_RUN, c->nw + r * step, LIT_SAMPLE_RUN);
        size_t z = ZSTD_compressCCtx(b->cctx, b->lit, ZSTD_compressBound(n), b->old, n, ZLEVEL_LIT);
        if (ZSTD_isError(z) || (double)z * (double)len / (double)n > LIT_SAMPLE_MARGIN * (double)rival)
            return len;
    }
    size_t z = ZSTD_compressCCtx(b->cctx, b->lit, ZSTD_compressBound(len), c->nw, len, ZLEVEL_LIT);
    return ZSTD_isError(z) || z >= len ? len : z;
}

static void chunk_task(void *arg, size_t i, uint32_t worker) {
    batch_ctx *x = arg;
    chunk *c = &x->chunks[i];
    worker_buf *b = &x->wb[worker];
    int r = read_exact(x->new_fd, c->nw, c->len, c->new_off);
    if (r == 0 && !c->zero && (c->width || c->has_old)) r = read_exact(x->old_fd, b->old, c->len, c->old_off);
    if (r != 0) {
        c->failed = r < 0 ? MD_E_IO : MD_E_INVALID; /* MD_E_INVALID here: a file shrank */
        return;
    }
    if (c->zero) {
        /* A tensor new to this file: its byte planes against zeros (the numeric
         * frame's "no basis" form), or a literal frame if that is smaller. */
        memset(b->old, 0, (size_t)c->len);
        size_t num = encode_numeric(c, b);
        c->param |= MD_NUMERIC_NO_BASIS;
        c->n_pieces = 0;
        if (literal_cost(c, b, num) + 2 < num) encode_literal(c, c->nw, b->cctx);
        return;
    }
    if ((c->width || c->has_old) && memcmp(b->old, c->nw, (size_t)c->len) == 0) {
        c->kind = K_COPY;
        hash_pieces(c, b->old);
        return;
    }
    if (!c->width) {
        encode_literal(c, c->nw, b->cctx);
        return;
    }
    size_t num = encode_numeric(c, b);
    hash_pieces(c, b->old);
    if (num > TRY_LITERAL_ABOVE * (double)c->len && literal_cost(c, b, num) + 2 < num)
        encode_literal(c, c->nw, b->cctx);
}

/* ---------------- regions ---------------- */

typedef struct regions {
    region *v;
    size_t n, cap;
} regions;

static int push_region(regions *r, uint64_t new_off, uint64_t len, uint64_t old_off, uint32_t width,
                       int has_old) {
    if (!len) return 0;
    if (r->n == r->cap) {
        size_t nc = r->cap ? r->cap * 2 : 64;
        region *nv = realloc(r->v, nc * sizeof *nv);
        if (!nv) return -1;
        r->v = nv;
        r->cap = nc;
    }
    r->v[r->n++] = (region){new_off, len, old_off, width, has_old, 0};
    return 0;
}

/* A plain stretch of NEW: compared with OLD at the same offset where OLD has bytes. */
static int push_plain(regions *r, uint64_t off, uint64_t len, uint64_t old_len) {
    if (off < old_len) {
        uint64_t both = old_len - off < len ? old_len - off : len;
        if (push_region(r, off, both, off, 0, 1) != 0) return -1;
        off += both;
        len -= both;
    }
    return push_region(r, off, len, 0, 0, 0);
}

static int cmp_name(const md_tensor *a, const md_tensor *b) {
    uint32_t n = a->name_len < b->name_len ? a->name_len : b->name_len;
    int c = memcmp(a->name, b->name, n);
    if (c) return c;
    return a->name_len < b->name_len ? -1 : a->name_len > b->name_len;
}
static int cmp_name_ptr(const void *x, const void *y) {
    return cmp_name(*(const md_tensor *const *)x, *(const md_tensor *const *)y);
}

/* Tensors paired by name: a tensor added, removed, reordered or resized costs only itself. */
static int plan_safetensors(const md_st *o, const md_st *nw, uint64_t old_len, uint64_t new_len, regions *r) {
    const md_tensor **by_name = malloc((o->n ? o->n : 1) * sizeof *by_name);
    if (!by_name) return -1;
    for (size_t i = 0; i < o->n; i++) by_name[i] = &o->t[i];
    qsort(by_name, o->n, sizeof *by_name, cmp_name_ptr);
    uint64_t at = 0;
    int rc = 0;
    for (size_t i = 0; i < nw->n && rc == 0; i++) {
        const md_tensor *t = &nw->t[i];
        if (t->off > at) rc = push_plain(r, at, t->off - at, old_len);
        if (rc) break;
        size_t lo = 0, hi = o->n;
        const md_tensor *match = NULL;
        while (lo < hi) {
            size_t mid = (lo + hi) / 2;
            int c = cmp_name(by_name[mid], t);
            if (c == 0) {
                match = by_name[mid];
                break;
            }
            if (c < 0) lo = mid + 1;
            else hi = mid;
        }
        if (match && t->width && match->width == t->width && match->len == t->len) {
            rc = push_region(r, t->off, t->len, match->off, t->width, 0);
        } else if (t->width >= 2 && !match) {
            rc = push_region(r, t->off, t->len, 0, t->width, 0);
            if (rc == 0) r->v[r->n - 1].zero = 1;
        } else {
            rc = push_plain(r, t->off, t->len, old_len);
        }
        at = t->off + t->len;
    }
    if (rc == 0 && at < new_len) rc = push_plain(r, at, new_len - at, old_len);
    free(by_name);
    return rc;
}

/* ---------------- stitching ---------------- */

typedef struct out_state {
    md_writer w;
    uint64_t seq;
    /* the pending DATA frame of copies */
    uint8_t *copies;
    size_t copies_len;
    uint32_t n_copies;
    uint64_t prev_copy_end, check;
} out_state;

static int flush_copies(out_state *s) {
    if (!s->n_copies) return 0;
    size_t len = md_frame_seal(s->copies, MD_FRAME_DATA, MD_CODEC_RAW, 0, (uint32_t)s->copies_len, 0, 0,
                               s->seq++, s->check);
    s->n_copies = 0;
    s->copies_len = 0;
    return md_writer_put(&s->w, s->copies, len);
}

static int add_copy(out_state *s, const chunk *c) {
    if (s->n_copies == FRAME_MAX_CMDS && flush_copies(s) != 0) return -1;
    if (!s->n_copies) {
        s->prev_copy_end = 0;
        s->check = s->seq;
    }
    uint8_t *cp = s->copies + MD_FRAME_HDR_LEN + s->copies_len;
    size_t k = md_put_varint(cp, (c->len << 1) | 1);
    k += md_put_varint(cp + k, md_zigzag((int64_t)(c->old_off - s->prev_copy_end)));
    s->copies_len += k;
    s->prev_copy_end = c->old_off + c->len;
    for (unsigned p = 0; p < c->n_pieces; p++) s->check = md_ph_chain(s->check, c->pieces[p], PIECE_HASH);
    s->n_copies++;
    return 0;
}

static int emit_chunk(out_state *s, chunk *c) {
    if (c->kind == K_COPY) return add_copy(s, c);
    if (flush_copies(s) != 0) return -1;
    uint64_t seq = s->seq++, check = seq;
    uint32_t lit_len = (uint32_t)c->len;
    if (c->kind == K_NUMERIC)
        for (unsigned p = 0; p < c->n_pieces; p++) check = md_ph_chain(check, c->pieces[p], PIECE_HASH);
    uint8_t type = c->kind == K_NUMERIC ? MD_FRAME_NUMERIC : MD_FRAME_DATA;
    size_t len = md_frame_seal(c->out, type, c->codec, c->param, c->cmd_len, lit_len, c->stored, seq, check);
    return md_writer_put(&s->w, c->out, len);
}

/* Without a numeric model: the rolling-hash delta against a signature made in memory. */
static md_status via_signature(int old_fd, int new_fd, int delta_fd, const md_options *opt, md_stats *stats,
                               md_error *err) {
    int sig_fd = memfd_create("meridian-signature", MFD_CLOEXEC);
    if (sig_fd < 0) return md_fail_io(err, errno, "making the signature of OLD");
    md_options so = opt ? *opt : (md_options){0};
    so.progress = NULL;
    so.block_len = 0;
    md_status rc = md_signature(old_fd, sig_fd, &so, NULL, err);
    if (rc == MD_OK && lseek(sig_fd, 0, SEEK_SET) != 0) rc = md_fail_io(err, errno, "reading the signature");
    if (rc == MD_OK) rc = md_delta(sig_fd, new_fd, delta_fd, opt, stats, err);
    close(sig_fd);
    return rc;
}

md_status md_delta_basis(int old_fd, int new_fd, int delta_fd, const md_options *opt, md_stats *stats,
                         md_error *err) {
    uint32_t threads;
    md_status rc = md_begin(opt, &threads, err);
    if (rc != MD_OK) return rc;
    uint32_t width = opt ? opt->elem_width : 0;
    if (width && width != 1 && width != 2 && width != 4 && width != 8)
        return md_fail(err, MD_E_INVALID, "the element size must be 1, 2, 4 or 8 bytes, not %u.", width);
    struct stat so, sn;
    if (fstat(old_fd, &so) != 0) return md_fail_io(err, errno, "reading OLD");
    if (fstat(new_fd, &sn) != 0) return md_fail_io(err, errno, "reading NEW");
    if (!S_ISREG(so.st_mode)) return md_fail(err, MD_E_INVALID, "OLD must be a regular file.");
    if (!S_ISREG(sn.st_mode)) return md_fail(err, MD_E_INVALID, "NEW must be a regular file.");
    uint64_t old_len = (uint64_t)so.st_size, new_len = (uint64_t)sn.st_size;

    regions rg = {0};
    md_st sto = {0}, stn = {0};
    int model = 0;
    if (width) {
        uint64_t both = (old_len < new_len ? old_len : new_len) / width * width;
        model = push_region(&rg, 0, both, 0, width, 0) == 0 && push_plain(&rg, both, new_len - both, old_len) == 0;
        if (!model) rc = md_fail(err, MD_E_NOMEM, "out of memory while making a delta.");
    } else {
        int a = md_st_parse(old_fd, old_len, &sto), b = a == 1 ? md_st_parse(new_fd, new_len, &stn) : 0;
        if (a < 0 || b < 0) rc = md_fail(err, MD_E_NOMEM, "out of memory or a read error while reading the safetensors headers.");
        else if (a == 1 && b == 1) {
            model = plan_safetensors(&sto, &stn, old_len, new_len, &rg) == 0;
            if (!model) rc = md_fail(err, MD_E_NOMEM, "out of memory while making a delta.");
        }
    }
    md_st_free(&sto);
    md_st_free(&stn);
    if (rc != MD_OK || !model) {
        free(rg.v);
        if (rc != MD_OK) return rc;
        return via_signature(old_fd, new_fd, delta_fd, opt, stats, err);
    }

    worker_buf wb[MD_MAX_WORKERS] = {0};
    chunk chunks[BATCH];
    memset(chunks, 0, sizeof chunks);
    out_state s;
    memset(&s, 0, sizeof s);
    md_digest dg = {0};
    uint64_t copy_bytes = 0, literal_bytes = 0, numeric_bytes = 0;
    uint8_t *scratch = NULL;
    size_t scratch_len = 0, out_in_scratch = 0;
    /* room for the planes written one after another, the last one with its full rANS
     * bound, or for one zstd literal block */
    size_t out_cap = MD_FRAME_HDR_LEN + 8 + 4 * 8 + 8 + CHUNK + 8 + md_rans_bound(CHUNK) + ZSTD_compressBound(CHUNK);
    int ok = md_writer_init(&s.w, delta_fd, 1 << 20) == 0 && md_digest_init(&dg) == 0;
    s.copies = malloc(MD_FRAME_HDR_LEN + (size_t)FRAME_MAX_CMDS * 20 + 8);
    ok = ok && s.copies;
    /* One thread takes one chunk at a time: its buffers are reused while still in
     * cache and never more are touched (page faults were ~5% of a small diff). */
    uint32_t batch = threads == 1 ? 1 : BATCH;
    /* The buffers every chunk writes through in full, in one scratch mapping (huge
     * pages: their 4 KiB faults were ~20% of a diff of a few MiB); with one chunk
     * at a time its frame buffer too (a frame fills its first MiB or so). */
    out_in_scratch = batch == 1 ? (out_cap + 63) & ~(size_t)63 : 0;
    scratch_len = (size_t)threads * 3 * CHUNK + (size_t)batch * CHUNK + out_in_scratch;
    scratch = md_scratch_alloc(scratch_len);
    ok = ok && scratch;
    for (uint32_t t = 0; ok && t < threads; t++) {
        wb[t].old = scratch + (size_t)t * 3 * CHUNK;
        wb[t].planes = wb[t].old + CHUNK;
        wb[t].renc = wb[t].planes + CHUNK;
        wb[t].lit = malloc(ZSTD_compressBound(CHUNK));
        wb[t].cctx = ZSTD_createCCtx();
        wb[t].pctx = ZSTD_createCCtx();
        ok = wb[t].lit && wb[t].cctx && wb[t].pctx &&
             !ZSTD_isError(ZSTD_CCtx_setParameter(wb[t].pctx, ZSTD_c_compressionLevel, ZLEVEL)) &&
             !ZSTD_isError(ZSTD_CCtx_setParameter(wb[t].pctx, ZSTD_c_hashLog, PLANE_HASH_LOG)) &&
             !ZSTD_isError(ZSTD_CCtx_setParameter(wb[t].pctx, ZSTD_c_minMatch, PLANE_MIN_MATCH));
    }
    for (uint32_t i = 0; ok && i < batch; i++) {
        chunks[i].nw = scratch + (size_t)threads * 3 * CHUNK + (size_t)i * CHUNK;
        chunks[i].out = out_in_scratch ? scratch + scratch_len - out_in_scratch : malloc(out_cap);
        chunks[i].out_cap = out_cap;
        ok = chunks[i].out != NULL;
    }
    if (!ok) {
        rc = md_fail(err, MD_E_NOMEM, "out of memory while making a delta.");
        goto done;
    }
    uint8_t hdr[MD_HEADER_LEN];
    md_delta_header(hdr, old_len, NULL, PIECE_LEN, PIECE_HASH);
    md_writer_put(&s.w, hdr, sizeof hdr);

    size_t ri = 0;
    uint64_t in_region = 0;
    for (;;) {
        if (md_cancelled(opt)) {
            rc = md_fail(err, MD_E_CANCELLED, "the delta was cancelled.");
            goto done;
        }
        size_t nb = 0;
        while (nb < batch && ri < rg.n) {
            region *g = &rg.v[ri];
            uint64_t take = g->len - in_region < CHUNK ? g->len - in_region : CHUNK;
            chunk *c = &chunks[nb++];
            c->new_off = g->new_off + in_region;
            c->old_off = g->old_off + in_region;
            c->len = take;
            c->width = g->width;
            c->has_old = g->has_old;
            c->zero = g->zero;
            if (c->zero) c->old_off = 0;
            c->failed = 0;
            in_region += take;
            if (in_region == g->len) {
                ri++;
                in_region = 0;
            }
        }
        if (!nb) break;
        batch_ctx x = {old_fd, new_fd, chunks, wb};
        md_parallel_for(threads, nb, chunk_task, &x);
        for (size_t i = 0; i < nb; i++) {
            chunk *c = &chunks[i];
            if (c->failed) {
                rc = c->failed == MD_E_NOMEM ? md_fail(err, MD_E_NOMEM, "out of memory while making a delta.")
                     : c->failed == MD_E_IO  ? md_fail_io(err, EIO, "reading OLD or NEW")
                                             : md_fail(err, MD_E_IO, "OLD or NEW shrank while the delta was being made.");
                goto done;
            }
            md_digest_update(&dg, c->nw, (size_t)c->len);
            if (emit_chunk(&s, c) != 0) {
                rc = md_fail_io(err, s.w.failed_errno, "writing the delta");
                goto done;
            }
            if (c->kind == K_COPY) copy_bytes += c->len;
            else if (c->kind == K_NUMERIC) numeric_bytes += c->len;
            else literal_bytes += c->len;
        }
        if (opt && opt->progress)
            __atomic_store_n(opt->progress, chunks[nb - 1].new_off + chunks[nb - 1].len, __ATOMIC_RELAXED);
    }
    if (flush_copies(&s) != 0) {
        rc = md_fail_io(err, s.w.failed_errno, "writing the delta");
        goto done;
    }
    {
        uint8_t end[MD_END_FRAME_LEN], digest[16];
        md_digest_final(&dg, digest);
        md_end_frame(end, s.seq, new_len, digest);
        md_writer_put(&s.w, end, sizeof end);
    }
    if (md_writer_flush(&s.w) != 0) {
        rc = md_fail_io(err, s.w.failed_errno, "writing the delta");
        goto done;
    }
    if (stats) {
        memset(stats, 0, sizeof *stats);
        stats->input_bytes = new_len;
        stats->output_bytes = s.w.total;
        stats->copy_bytes = copy_bytes;
        stats->literal_bytes = literal_bytes;
        stats->numeric_bytes = numeric_bytes;
        stats->block_len = PIECE_LEN;
        stats->strong_len = PIECE_HASH;
        stats->threads = threads;
    }
done:
    for (uint32_t t = 0; t < MD_MAX_WORKERS; t++) {
        free(wb[t].lit);
        ZSTD_freeCCtx(wb[t].cctx);
        ZSTD_freeCCtx(wb[t].pctx);
    }
    if (!out_in_scratch)
        for (uint32_t i = 0; i < BATCH; i++) free(chunks[i].out);
    md_scratch_free(scratch, scratch_len);
    free(s.copies);
    md_writer_free(&s.w);
    md_digest_free(&dg);
    free(rg.v);
    return rc;
}
