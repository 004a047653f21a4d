/* The plane coders of numeric frames since delta engine 2.1: order-0 rANS with 32
 * (plane codec 3) or 64 (plane codec 4, engine 2.3) interleaved 32-bit states and
 * 16-bit renormalization.
 *
 * Why not the four-state byte-wise coder (codec 2, md_rans.c, still decoded): its
 * renormalization is a loop of byte reads whose trip count is data-dependent, a
 * mispredicted branch on nearly every symbol of a noisy plane, and four states
 * leave the multiplier idle; it ran at ~230 MB/s each way, 60% of a --basis diff.
 * Here the state interval is [2^15, 2^31) with 16-bit words, so a step reads or
 * writes at most one word (a conditional move, no loop) and the reciprocal of the
 * encoder stays exact (states below 2^31).
 *
 * Why 64 states (codec 4): a decoding step of one vector of states is a chain of
 * gather, multiply, compare and word insertion, about 45 cycles, and the next
 * step of the same states waits for it. With 32 states (two AVX-512 vectors) one
 * plane keeps the core waiting most of that time: decoding ran at ~1.5 GB/s, the
 * patch's largest cost, while the same instructions without the wait would run
 * ~3x faster. Sixty-four states are four independent chains per plane (eight with
 * two planes at once) for 128 more bytes of states per plane (~0.05% of a 1 MiB
 * frame's planes).
 *
 * Layout (FORMAT.md): 256 frequencies as LEB128 varints summing to 4096; the
 * `lanes` u32 final states, each in [2^15, 2^31); then 16-bit little-endian words.
 * Symbol i uses state i mod lanes; after decoding it, a state below 2^15 takes the
 * next word. The decoder checks every frequency and state, never reads past the
 * plane, and requires the stream to end exactly where the encoder began (all bytes
 * used, every state back at 2^15).
 *
 * Kernels: portable C, AVX2 (eight lanes a vector) and AVX-512 F/BW/VL (sixteen);
 * all write and read the same bytes (md_test compares them). */
#include <stdlib.h>
#include <string.h>

#include "md_internal.h"

#define SCALE_BITS 12u
#define SCALE (1u << SCALE_BITS)
#define LOW (1u << 15) /* states live in [LOW, LOW << 16) */
#define MAX_LANES 64u
/* one group of `lanes` symbols moves at most 2 * lanes bytes */
#define GROUP_BYTES(lanes) (2u * (lanes))
#ifndef DOM_MIN
#define DOM_MIN 3686u /* 90% of the slots */
#endif

static int lanes_ok(unsigned lanes) { return lanes == 32 || lanes == 64; }

/* Division-free encoding of symbol s (start c, frequency f) from state x:
 * x' = (x / f) * SCALE + x mod f + c, with x / f as a multiply by a rounded-up
 * reciprocal and a shift (exact below 2^31); x_max is the bound above which x
 * first gives up its low 16 bits. */
typedef struct esym {
    uint32_t x_max, rcp, bias;
    uint16_t cmpl, shift;
} esym;

static void esym_init(esym *e, uint32_t start, uint32_t f) {
    e->x_max = (LOW >> SCALE_BITS << 16) * f; /* f << 19: below 2^31 + 1 for f <= 4096 */
    e->cmpl = (uint16_t)(SCALE - f);
    if (f < 2) { /* x / 1 = x: x * (2^32 - 1) >> 32 = x - 1, the missing 1 in the bias */
        e->rcp = ~0u;
        e->shift = 0;
        e->bias = start + SCALE - 1;
    } else {
        uint32_t sh = 0;
        while (f > (1u << sh)) sh++;
        e->rcp = (uint32_t)((((uint64_t)1 << (sh + 31)) + f - 1) / f);
        e->shift = (uint16_t)(sh - 1);
        e->bias = start;
    }
}

static inline uint32_t enc_step(uint32_t x, const esym *e, uint8_t **p) {
    /* The word is stored whether or not it is emitted (the caller keeps room for
     * it); only the pointer moves conditionally, so there is no branch to miss. */
    uint32_t big = x >= e->x_max;
    (*p)[-2] = (uint8_t)x;
    (*p)[-1] = (uint8_t)(x >> 8);
    *p -= 2 * big;
    x >>= 16 * big;
    uint32_t q = (uint32_t)(((uint64_t)x * e->rcp) >> 32) >> e->shift;
    return x + e->bias + q * e->cmpl;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#include <pthread.h>
#define MD_RANS16_SIMD 1

/* A symbol's constants for the vector encoders: the reciprocal, and bias (13 bits)
 * | cmpl << 13 (12 bits) | shift << 25 packed in one word. (One table of both in a
 * u64, loaded by 64-bit gathers, measured no faster alone and slower in pairs.) */
typedef struct esym_v {
    uint32_t rcp[256];
    uint32_t packed[256];
} esym_v;

/* Eight lanes at once, the same arithmetic as enc_step: the symbols' constants
 * gathered from per-field tables, the reciprocal's high half from two 32x32->64
 * multiplies (even lanes, then odd), and the words of the lanes that emit packed
 * in lane order and stored right below p (a 16-byte store ending at p: the bytes
 * under the new p are scratch). The caller keeps 16 bytes of room per vector. */
__attribute__((target("avx2"))) static inline __m256i enc_vec(__m256i x, const esym_v *t, const uint8_t *s8,
                                                              uint8_t **pp, const uint32_t (*top)[8]) {
    __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)s8));
    __m256i rcp = _mm256_i32gather_epi32((const int *)t->rcp, idx, 4);
    __m256i pk = _mm256_i32gather_epi32((const int *)t->packed, idx, 4);
    __m256i bias = _mm256_and_si256(pk, _mm256_set1_epi32(0x1fff));
    __m256i cmpl = _mm256_and_si256(_mm256_srli_epi32(pk, 13), _mm256_set1_epi32(0xfff));
    __m256i shift = _mm256_srli_epi32(pk, 25);
    /* x_max - 1 = ((SCALE - cmpl) << 19) - 1 */
    __m256i xmax1 = _mm256_sub_epi32(_mm256_slli_epi32(_mm256_sub_epi32(_mm256_set1_epi32(SCALE), cmpl), 19),
                                     _mm256_set1_epi32(1));
    /* states stay below 2^31 and x_max - 1 below 2^31: a signed comparison is exact */
    __m256i big = _mm256_cmpgt_epi32(x, xmax1);
    unsigned m = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(big));
    __m256i words = _mm256_permutevar8x32_epi32(x, _mm256_loadu_si256((const __m256i *)top[m]));
    const __m256i pick = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1, 0, 1, 4, 5, 8,
                                          9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1);
    words = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(words, pick), 0x08);
    _mm_storeu_si128((__m128i *)(*pp - 16), _mm256_castsi256_si128(words));
    *pp -= 2 * (unsigned)__builtin_popcount(m);
    x = _mm256_blendv_epi8(x, _mm256_srli_epi32(x, 16), big);
    __m256i even = _mm256_srli_epi64(_mm256_mul_epu32(x, rcp), 32);
    __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(x, 32), _mm256_srli_epi64(rcp, 32));
    __m256i q = _mm256_blend_epi32(even, odd, 0xAA);
    q = _mm256_srlv_epi32(q, shift);
    return _mm256_add_epi32(_mm256_add_epi32(x, bias), _mm256_mullo_epi32(q, cmpl));
}

/* Sixteen lanes at once (AVX-512): the words of the lanes that emit compressed to
 * the bottom of a vector (vpcompressd), narrowed to 16 bits and written by a masked
 * store right below p, with no lookup table for their order. */
__attribute__((target("avx512f,avx512bw,avx512vl"), always_inline)) static inline __m512i enc_step16(__m512i x,
                                                                                                   __m512i rcp,
                                                                                                   __m512i pk,
                                                                                                   uint8_t **pp) {
    __m512i bias = _mm512_and_si512(pk, _mm512_set1_epi32(0x1fff));
    __m512i cmpl = _mm512_and_si512(_mm512_srli_epi32(pk, 13), _mm512_set1_epi32(0xfff));
    __m512i shift = _mm512_srli_epi32(pk, 25);
    __m512i xmax = _mm512_slli_epi32(_mm512_sub_epi32(_mm512_set1_epi32(SCALE), cmpl), 19);
    __mmask16 big = _mm512_cmpge_epu32_mask(x, xmax);
    unsigned n = (unsigned)__builtin_popcount((unsigned)big);
    __m256i words = _mm512_cvtepi32_epi16(_mm512_maskz_compress_epi32(big, x));
    *pp -= 2 * n;
    _mm256_mask_storeu_epi16(*pp, (__mmask16)((1u << n) - 1u), words);
    x = _mm512_mask_srli_epi32(x, big, x, 16);
    __m512i even = _mm512_srli_epi64(_mm512_mul_epu32(x, rcp), 32);
    __m512i odd = _mm512_mul_epu32(_mm512_srli_epi64(x, 32), _mm512_srli_epi64(rcp, 32));
    __m512i q = _mm512_srlv_epi32(_mm512_mask_blend_epi32(0xAAAA, even, odd), shift);
    return _mm512_add_epi32(_mm512_add_epi32(x, bias), _mm512_mullo_epi32(q, cmpl));
}
__attribute__((target("avx512f,avx512bw,avx512vl"))) static inline __m512i enc_vec16(__m512i x, const esym_v *t,
                                                                                      const uint8_t *s16,
                                                                                      uint8_t **pp) {
    __m512i idx = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)s16));
    __m512i rcp = _mm512_i32gather_epi32(idx, (const int *)t->rcp, 4);
    __m512i pk = _mm512_i32gather_epi32(idx, (const int *)t->packed, 4);
    return enc_step16(x, rcp, pk, pp);
}

/* top[m]: the lanes set in m, in order, moved to the top of the vector */
static uint32_t top[256][8];
static pthread_once_t top_once = PTHREAD_ONCE_INIT;
static void top_init(void) {
    for (unsigned m = 0; m < 256; m++) {
        unsigned c = (unsigned)__builtin_popcount(m), k = 8 - c;
        for (unsigned j = 0; j < 8; j++) top[m][j] = 0;
        for (unsigned j = 0; j < 8; j++)
            if ((m >> j) & 1) top[m][k++] = j;
    }
}
#else
#define MD_RANS16_SIMD 0
#endif

/* One plane being encoded: symbols from the last to the first, words growing down
 * from the end of dst (moved up behind the header and states at the end). */
typedef struct enc16 {
    const uint8_t *src;
    const uint32_t *count; /* the caller's counts, while encoding */
    size_t i, hdr;
    unsigned lanes;
    uint8_t *dst, *end, *p, *floor;
    uint32_t x[MAX_LANES];
    esym sym[256];
#if MD_RANS16_SIMD
    esym_v v;
#endif
} enc16;

/* The header and the symbols after the last whole group; 0, or -1 when it does not fit. */
static int enc_open(enc16 *e, const uint8_t *src, size_t n, const uint32_t count[256], uint8_t *dst, size_t cap,
                    unsigned lanes) {
    uint32_t freq[256];
    if (!n || !lanes_ok(lanes) || cap < 256 * 2 + lanes * 4 + GROUP_BYTES(lanes) + 2) return -1;
    /* the counts may be a sample's (md_basis.c): normalized by their own total */
    size_t total = 0;
    for (int s = 0; s < 256; s++) total += count[s];
    md_rans_normalize(count, total ? total : n, freq);
    uint32_t acc = 0;
    e->hdr = 0;
    e->lanes = lanes;
    for (int s = 0; s < 256; s++) {
        esym_init(&e->sym[s], acc, freq[s] ? freq[s] : 1);
        acc += freq[s];
        e->hdr += md_put_varint(dst + e->hdr, freq[s]);
    }
    /* A group writes at most GROUP_BYTES (plus the one word stored without being
     * emitted), so one check per group keeps every write above the states. */
    e->src = src;
    e->count = count;
    e->dst = dst;
    e->end = e->p = dst + cap;
    e->floor = dst + e->hdr + lanes * 4 + GROUP_BYTES(lanes) + 2;
    if (e->p < e->floor) return -1;
    for (unsigned j = 0; j < lanes; j++) e->x[j] = LOW;
    size_t i = n;
    while (i % lanes) {
        i--;
        e->x[i % lanes] = enc_step(e->x[i % lanes], &e->sym[src[i]], &e->p);
    }
    e->i = i;
    return 0;
}

/* Whole groups, portable code; -1 when the output reaches the floor. */
static int enc_groups(enc16 *e) {
    uint8_t *p = e->p;
    size_t i = e->i;
    unsigned lanes = e->lanes;
    while (i) {
        if (p < e->floor) return -1;
        i -= lanes;
        for (unsigned j = lanes; j--;) e->x[j] = enc_step(e->x[j], &e->sym[e->src[i + j]], &p);
    }
    e->p = p;
    e->i = 0;
    return 0;
}

/* The coded size, or 0 when it did not fit. */
static size_t enc_close(enc16 *e) {
    if (e->p < e->floor) return 0;
    size_t stream = (size_t)(e->end - e->p);
    uint8_t *o = e->dst + e->hdr;
    for (unsigned j = 0; j < e->lanes; j++) md_put_u32(o + 4 * j, e->x[j]);
    memmove(o + e->lanes * 4, e->p, stream);
    return e->hdr + e->lanes * 4 + stream;
}

#if MD_RANS16_SIMD
static void enc_tables(enc16 *e) {
    for (unsigned s = 0; s < 256; s++) {
        e->v.rcp[s] = e->sym[s].rcp;
        e->v.packed[s] = e->sym[s].bias | (uint32_t)e->sym[s].cmpl << 13 | (uint32_t)e->sym[s].shift << 25;
    }
}

/* Whole groups of planes a and b in step (their groups are independent and overlap,
 * where one plane alone waits on its states' multiply chain), then of each alone;
 * a plane that reaches its floor is marked by p < floor and stops. NV vectors of
 * eight states per plane (a constant after inlining). */
__attribute__((target("avx2"), always_inline)) static inline void enc_avx2_n(enc16 *a, enc16 *b, unsigned nv) {
    pthread_once(&top_once, top_init);
    const uint32_t(*tp)[8] = (const uint32_t(*)[8])top;
    const unsigned lanes = 8 * nv;
    __m256i xa[MAX_LANES / 8], xb[MAX_LANES / 8];
    enc_tables(a);
    for (unsigned v = 0; v < nv; v++) xa[v] = _mm256_loadu_si256((const __m256i *)(a->x + 8 * v));
    uint8_t *pa = a->p, *pb = NULL;
    if (b) {
        enc_tables(b);
        for (unsigned v = 0; v < nv; v++) xb[v] = _mm256_loadu_si256((const __m256i *)(b->x + 8 * v));
        pb = b->p;
        while (a->i && b->i && pa >= a->floor && pb >= b->floor) {
            a->i -= lanes;
            b->i -= lanes;
            for (unsigned v = nv; v--;) {
                xa[v] = enc_vec(xa[v], &a->v, a->src + a->i + 8 * v, &pa, tp);
                xb[v] = enc_vec(xb[v], &b->v, b->src + b->i + 8 * v, &pb, tp);
            }
        }
        while (b->i && pb >= b->floor) {
            b->i -= lanes;
            for (unsigned v = nv; v--;) xb[v] = enc_vec(xb[v], &b->v, b->src + b->i + 8 * v, &pb, tp);
        }
        for (unsigned v = 0; v < nv; v++) _mm256_storeu_si256((__m256i *)(b->x + 8 * v), xb[v]);
        b->p = pb;
    }
    while (a->i && pa >= a->floor) {
        a->i -= lanes;
        for (unsigned v = nv; v--;) xa[v] = enc_vec(xa[v], &a->v, a->src + a->i + 8 * v, &pa, tp);
    }
    for (unsigned v = 0; v < nv; v++) _mm256_storeu_si256((__m256i *)(a->x + 8 * v), xa[v]);
    a->p = pa;
}
__attribute__((target("avx2"))) static void enc_avx2_32(enc16 *a, enc16 *b) { enc_avx2_n(a, b, 4); }
__attribute__((target("avx2"))) static void enc_avx2_64(enc16 *a, enc16 *b) { enc_avx2_n(a, b, 8); }

/* The same with sixteen states a vector (AVX-512). The vectors of one group are
 * coded from the last to the first, each writing its words below the previous
 * one's, so the words lie in lane order as the scalar code writes them. */
__attribute__((target("avx512f,avx512bw,avx512vl"), always_inline)) static inline void enc_avx512_n(enc16 *a,
                                                                                                  enc16 *b,
                                                                                                  unsigned nv) {
    const unsigned lanes = 16 * nv;
    __m512i xa[MAX_LANES / 16], xb[MAX_LANES / 16];
    enc_tables(a);
    for (unsigned v = 0; v < nv; v++) xa[v] = _mm512_loadu_si512((const void *)(a->x + 16 * v));
    uint8_t *pa = a->p, *pb = NULL;
    if (b) {
        enc_tables(b);
        for (unsigned v = 0; v < nv; v++) xb[v] = _mm512_loadu_si512((const void *)(b->x + 16 * v));
        pb = b->p;
        while (a->i && b->i && pa >= a->floor && pb >= b->floor) {
            a->i -= lanes;
            b->i -= lanes;
            for (unsigned v = nv; v--;) {
                xa[v] = enc_vec16(xa[v], &a->v, a->src + a->i + 16 * v, &pa);
                xb[v] = enc_vec16(xb[v], &b->v, b->src + b->i + 16 * v, &pb);
            }
        }
        while (b->i && pb >= b->floor) {
            b->i -= lanes;
            for (unsigned v = nv; v--;) xb[v] = enc_vec16(xb[v], &b->v, b->src + b->i + 16 * v, &pb);
        }
        for (unsigned v = 0; v < nv; v++) _mm512_storeu_si512((void *)(b->x + 16 * v), xb[v]);
        b->p = pb;
    }
    while (a->i && pa >= a->floor) {
        a->i -= lanes;
        for (unsigned v = nv; v--;) xa[v] = enc_vec16(xa[v], &a->v, a->src + a->i + 16 * v, &pa);
    }
    for (unsigned v = 0; v < nv; v++) _mm512_storeu_si512((void *)(a->x + 16 * v), xa[v]);
    a->p = pa;
}
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void enc_avx512_32(enc16 *a, enc16 *b) {
    enc_avx512_n(a, b, 2);
}
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void enc_avx512_64(enc16 *a, enc16 *b) {
    enc_avx512_n(a, b, 4);
}

/* Gather-free lookups (AVX-512 VBMI). The gathers of the kernels above are half of
 * the encoder's time: each fetches sixteen words with sixteen loads. Here each
 * symbol's rank among the symbols with a count comes from a 256-entry byte table
 * for 64 symbols at once (vpermi2b looks up 128 entries held in two registers: two
 * of them and a blend on bit 7), and the rank's rcp and packed words from the
 * tables in 32-rank pieces, two registers each (vpermi2d, sixteen lanes at once),
 * each piece kept where the rank falls in it. A plane with at most 32 symbols takes
 * one piece; one with all 256, eight (16 permutes and 14 blends for 16 lanes) --
 * still faster than the two gathers on this machine's Zen core: rANS-64 encode in
 * pairs, md_floor, bf16 100-step pair 2.06 -> 3.47 GB/s, fp32 Adam moments 2.08 ->
 * 2.9, fp32 master weights 2.49 -> 3.04 (byte tables for all 256 symbols, eight
 * byte lookups per 64 symbols then unpacks into dwords, measured no faster than
 * the gathers). The states' arithmetic is enc_step16's, so the bytes are those of
 * every other kernel. */
#define VBMI_TARGET "avx512f,avx512bw,avx512vl,avx512vbmi"

typedef struct esym_b {
    _Alignas(64) uint8_t rank[256];
    _Alignas(64) uint32_t rcp[256], packed[256];
    unsigned segs; /* the pieces of 32 ranks that hold a symbol with a count (1..8) */
} esym_b;

/* A symbol without a count cannot be decoded, so no valid input holds one: ranks
 * are given only to the symbols with a count. */
static void enc_small(enc16 *e, esym_b *b) {
    enc_tables(e);
    unsigned k = 0;
    memset(b, 0, sizeof *b);
    for (unsigned s = 0; s < 256; s++)
        if (e->count[s]) {
            b->rank[s] = (uint8_t)k;
            b->rcp[k] = e->v.rcp[s];
            b->packed[k] = e->v.packed[s];
            k++;
        }
    b->segs = k ? (k + 31) / 32 : 1;
}

/* rcp and packed of the 64 symbols in sym, sixteen lanes a vector, in lane order:
 * the ranks of the 64 symbols, then for each vector the rank of its lanes' symbols
 * as dwords (vpermb, the upper bytes zeroed), each 32 ranks' words from two
 * registers (vpermi2d) and kept where the rank is in that 32. */
__attribute__((target(VBMI_TARGET), always_inline)) static inline void lut64(__m512i sym, const esym_b *b,
                                                                                  __m512i rcp[4], __m512i pk[4],
                                                                                  unsigned segs) {
    const __m512i *r = (const __m512i *)b->rank;
    const __m512i *tr = (const __m512i *)b->rcp, *tp = (const __m512i *)b->packed;
    __mmask64 hi = _mm512_movepi8_mask(sym);
    __m512i lo = _mm512_permutex2var_epi8(_mm512_load_si512(r), sym, _mm512_load_si512(r + 1));
    __m512i up = _mm512_permutex2var_epi8(_mm512_load_si512(r + 2), sym, _mm512_load_si512(r + 3));
    __m512i rk = _mm512_mask_blend_epi8(hi, lo, up);
    for (unsigned v = 0; v < 4; v++) {
        /* dword j of vector v takes byte 16 v + j */
        __m512i spread = _mm512_add_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                          _mm512_set1_epi32((int)(16 * v)));
        __m512i idx = _mm512_maskz_permutexvar_epi8(0x1111111111111111ull, spread, rk);
        rcp[v] = _mm512_permutex2var_epi32(_mm512_load_si512(tr), idx, _mm512_load_si512(tr + 1));
        pk[v] = _mm512_permutex2var_epi32(_mm512_load_si512(tp), idx, _mm512_load_si512(tp + 1));
        for (unsigned g = 1; g < segs; g++) {
            __mmask16 in = _mm512_cmpge_epu32_mask(idx, _mm512_set1_epi32((int)(32 * g)));
            const __m512i *rg = tr + 2 * g, *pg = tp + 2 * g;
            __m512i r_g = _mm512_permutex2var_epi32(_mm512_load_si512(rg), idx, _mm512_load_si512(rg + 1));
            __m512i p_g = _mm512_permutex2var_epi32(_mm512_load_si512(pg), idx, _mm512_load_si512(pg + 1));
            rcp[v] = _mm512_mask_blend_epi32(in, rcp[v], r_g);
            pk[v] = _mm512_mask_blend_epi32(in, pk[v], p_g);
        }
    }
}

/* The constants of the 64 symbols at s (a constant piece count after inlining). */
__attribute__((target(VBMI_TARGET), always_inline)) static inline void consts64(const esym_b *b, const uint8_t *s,
                                                                               __m512i rcp[4], __m512i pk[4]) {
    __m512i sym = _mm512_loadu_si512((const void *)s);
    switch (b->segs) {
    case 1: lut64(sym, b, rcp, pk, 1); return;
    case 2: lut64(sym, b, rcp, pk, 2); return;
    case 3: lut64(sym, b, rcp, pk, 3); return;
    case 4: lut64(sym, b, rcp, pk, 4); return;
    case 5: lut64(sym, b, rcp, pk, 5); return;
    case 6: lut64(sym, b, rcp, pk, 6); return;
    case 7: lut64(sym, b, rcp, pk, 7); return;
    default: lut64(sym, b, rcp, pk, 8); return;
    }
}

/* The groups of one plane in the 64 symbols below src + i (i a multiple of 64):
 * one group of 64 lanes, or two of 32, the upper first; a plane that reaches its
 * floor stops after the group that reached it. */
__attribute__((target(VBMI_TARGET), always_inline)) static inline void block_vbmi(enc16 *e, const esym_b *b,
                                                                                 __m512i *x, uint8_t **pp,
                                                                                 unsigned nv) {
    __m512i rcp[4], pk[4];
    const uint8_t *s = e->src + e->i - 64;
    consts64(b, s, rcp, pk);
    if (nv == 4) {
        for (unsigned v = 4; v--;) x[v] = enc_step16(x[v], rcp[v], pk[v], pp);
        e->i -= 64;
        return;
    }
    x[1] = enc_step16(x[1], rcp[3], pk[3], pp);
    x[0] = enc_step16(x[0], rcp[2], pk[2], pp);
    e->i -= 32;
    if (*pp < e->floor) return;
    x[1] = enc_step16(x[1], rcp[1], pk[1], pp);
    x[0] = enc_step16(x[0], rcp[0], pk[0], pp);
    e->i -= 32;
}

/* With 32 lanes and an odd number of groups: the top group alone. */
__attribute__((target(VBMI_TARGET), always_inline)) static inline void odd_vbmi(enc16 *e, const esym_b *b,
                                                                               __m512i *x, uint8_t **pp) {
    for (unsigned v = 2; v--;) {
        const uint8_t *s = e->src + e->i - 32 + 16 * v;
        __m512i idx = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)s));
        (void)b;
        x[v] = enc_step16(x[v], _mm512_i32gather_epi32(idx, (const int *)e->v.rcp, 4),
                          _mm512_i32gather_epi32(idx, (const int *)e->v.packed, 4), pp);
    }
    e->i -= 32;
}

__attribute__((target(VBMI_TARGET), always_inline)) static inline void enc_vbmi_n(enc16 *a, enc16 *b,
                                                                                 unsigned nv) {
    esym_b ta, tb;
    __m512i xa[4], xb[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(),
                            _mm512_setzero_si512()};
    uint8_t *pa = a->p, *pb = NULL;
    enc_small(a, &ta);
    for (unsigned v = 0; v < nv; v++) xa[v] = _mm512_loadu_si512((const void *)(a->x + 16 * v));
    if (b) {
        enc_small(b, &tb);
        for (unsigned v = 0; v < nv; v++) xb[v] = _mm512_loadu_si512((const void *)(b->x + 16 * v));
        pb = b->p;
    }
    /* (a pair's planes have the same length, so the same number of groups) */
    if (nv == 2 && a->i % 64) {
        if (pa >= a->floor) odd_vbmi(a, &ta, xa, &pa);
        if (b && pb >= b->floor) odd_vbmi(b, &tb, xb, &pb);
    }
    if (b)
        while ((a->i && pa >= a->floor) || (b->i && pb >= b->floor)) {
            if (a->i && pa >= a->floor) block_vbmi(a, &ta, xa, &pa, nv);
            if (b->i && pb >= b->floor) block_vbmi(b, &tb, xb, &pb, nv);
        }
    else
        while (a->i && pa >= a->floor) block_vbmi(a, &ta, xa, &pa, nv);
    for (unsigned v = 0; v < nv; v++) _mm512_storeu_si512((void *)(a->x + 16 * v), xa[v]);
    a->p = pa;
    if (b) {
        for (unsigned v = 0; v < nv; v++) _mm512_storeu_si512((void *)(b->x + 16 * v), xb[v]);
        b->p = pb;
    }
}
__attribute__((target(VBMI_TARGET))) static void enc_vbmi_32(enc16 *a, enc16 *b) { enc_vbmi_n(a, b, 2); }
__attribute__((target(VBMI_TARGET))) static void enc_vbmi_64(enc16 *a, enc16 *b) { enc_vbmi_n(a, b, 4); }
#endif

/* a, and b when not NULL (with the same lanes) */
static void enc_run(enc16 *a, enc16 *b) {
#if MD_RANS16_SIMD
    if (md_cpu_avx512vbmi()) {
        (a->lanes == 64 ? enc_vbmi_64 : enc_vbmi_32)(a, b);
        return;
    }
    if (md_cpu_avx512()) {
        (a->lanes == 64 ? enc_avx512_64 : enc_avx512_32)(a, b);
        return;
    }
    if (md_cpu_avx2()) {
        (a->lanes == 64 ? enc_avx2_64 : enc_avx2_32)(a, b);
        return;
    }
#endif
    if (a && enc_groups(a) != 0) a->p = a->floor - 1;
    if (b && enc_groups(b) != 0) b->p = b->floor - 1;
}

size_t md_rans16_encode(const uint8_t *src, size_t n, const uint32_t count[256], uint8_t *dst, size_t cap,
                        unsigned lanes) {
    enc16 *e = malloc(sizeof *e);
    size_t r = 0;
    if (e && enc_open(e, src, n, count, dst, cap, lanes) == 0) {
        enc_run(e, NULL);
        r = enc_close(e);
    }
    free(e);
    return r;
}

void md_rans16_encode2(const uint8_t *src_a, const uint32_t count_a[256], uint8_t *dst_a, size_t *len_a,
                       const uint8_t *src_b, const uint32_t count_b[256], uint8_t *dst_b, size_t *len_b, size_t n,
                       size_t cap, unsigned lanes) {
    enc16 *e = malloc(2 * sizeof *e);
    *len_a = *len_b = 0;
    if (!e) return;
    int oa = enc_open(&e[0], src_a, n, count_a, dst_a, cap, lanes) == 0;
    int ob = enc_open(&e[1], src_b, n, count_b, dst_b, cap, lanes) == 0;
    if (oa || ob) enc_run(oa ? &e[0] : &e[1], oa && ob ? &e[1] : NULL);
    if (oa) *len_a = enc_close(&e[0]);
    if (ob) *len_b = enc_close(&e[1]);
    free(e);
}

/* A decoding table entry: symbol in bits 0-7, slot - start in bits 8-19, f - 1 in 20-31.
 * *top gets the symbol of the largest frequency (the first of equals). */
static int build_table(const uint8_t *src, size_t len, size_t *at, uint32_t *tab, uint32_t *top_sym) {
    uint32_t acc = 0, top_f = 0;
    *at = 0;
    *top_sym = 0;
    for (uint32_t s = 0; s < 256; s++) {
        uint64_t f;
        size_t used = md_get_varint(src + *at, len - *at, &f);
        if (!used || f > SCALE - acc) return -1;
        *at += used;
        for (uint32_t k = 0; k < f; k++) tab[acc + k] = s | (k << 8) | ((uint32_t)(f - 1) << 20);
        if (f > top_f) {
            top_f = (uint32_t)f;
            *top_sym = s;
        }
        acc += (uint32_t)f;
    }
    return acc == SCALE ? 0 : -1;
}

static inline uint32_t dec_step(uint32_t x, const uint32_t *tab, uint8_t *out) {
    uint32_t e = tab[x & (SCALE - 1)];
    *out = (uint8_t)e;
    return ((e >> 20) + 1) * (x >> SCALE_BITS) + ((e >> 8) & (SCALE - 1));
}

/* One plane being decoded. A group of `lanes` symbols reads at most GROUP_BYTES
 * from p, so whole groups run without a bounds check while that many bytes are
 * left; then the last bytes move to `pad`, a copy followed by zeros, and groups
 * still run unchecked to the end of the plane (before, the last bytes of a stream
 * went through the checked loop one symbol at a time: on a nearly constant plane,
 * whose last 64 bytes code thousands of symbols, that was most of its time). A
 * group that reads past the real end leaves p beyond `end`, which fails the plane. */
typedef struct dec16 {
    uint32_t x[MAX_LANES];
    const uint8_t *p, *end;
    uint8_t *dst;
    size_t i, n;
    unsigned lanes;
    int in_pad;
    /* A symbol of at least DOM_MIN of the 4096 slots (the high byte plane of bf16
     * weights, 93-99% one value): a vector of states whose slots all fall in its
     * range is stepped from these three numbers, without the table gather. */
    int dom;
    uint32_t dom_sym, dom_start, dom_f;
    uint32_t tab[SCALE];
    uint8_t pad[2 * GROUP_BYTES(MAX_LANES)];
} dec16;

static int dec_open(dec16 *d, const uint8_t *src, size_t len, uint8_t *dst, size_t n, unsigned lanes) {
    size_t at;
    uint32_t top_sym;
    if (!lanes_ok(lanes) || build_table(src, len, &at, d->tab, &top_sym) != 0 || len - at < lanes * 4) return -1;
    d->dom_sym = top_sym;
    d->dom_f = 0;
    for (uint32_t m = 0; m < SCALE; m++) /* the top symbol's first slot and its frequency */
        if ((d->tab[m] & 0xff) == top_sym && (d->tab[m] >> 8 & (SCALE - 1)) == 0) {
            d->dom_start = m;
            d->dom_f = (d->tab[m] >> 20) + 1;
            break;
        }
    d->dom = d->dom_f >= DOM_MIN;
    for (unsigned j = 0; j < lanes; j++) {
        d->x[j] = md_get_u32(src + at + 4 * j);
        if (d->x[j] < LOW || d->x[j] >> 31) return -1;
    }
    d->p = src + at + lanes * 4;
    d->end = src + len;
    d->dst = dst;
    d->i = 0;
    d->n = n;
    d->lanes = lanes;
    d->in_pad = 0;
    return 0;
}

/* Whether the next group may run unchecked (moving to the padded copy if needed). */
static inline int dec_ready(dec16 *d, const uint8_t **p, const uint8_t **end, size_t i) {
    const unsigned lanes = d->lanes;
    if (i + lanes > d->n) return 0;
    if (*end - *p >= (ptrdiff_t)GROUP_BYTES(lanes)) return 1;
    if (d->in_pad) return *p <= *end;
    size_t k = (size_t)(*end - *p);
    memcpy(d->pad, *p, k);
    memset(d->pad + k, 0, sizeof d->pad - k);
    *p = d->pad;
    *end = d->pad + k;
    d->in_pad = 1;
    return 1;
}

/* The symbols from d->i on, one at a time with every read checked; then the plane
 * must have used exactly all of its words and left every state at LOW. */
static int dec_finish(dec16 *d) {
    const uint8_t *p = d->p, *end = d->end;
    if (p > end) return -1;
    for (size_t i = d->i; i < d->n; i++) {
        uint32_t *s = &d->x[i % d->lanes];
        *s = dec_step(*s, d->tab, d->dst + i);
        if (*s < LOW) {
            if (end - p < 2) return -1;
            *s = (*s << 16) | p[0] | (uint32_t)p[1] << 8;
            p += 2;
        }
    }
    if (p != end) return -1;
    for (unsigned j = 0; j < d->lanes; j++)
        if (d->x[j] != LOW) return -1;
    return 0;
}

/* Whole groups of one plane, portable code. */
static void dec_groups(dec16 *d) {
    const uint8_t *p = d->p, *end = d->end;
    size_t i = d->i;
    const unsigned lanes = d->lanes;
    uint32_t x[MAX_LANES];
    memcpy(x, d->x, sizeof x);
    for (; dec_ready(d, &p, &end, i); i += lanes) {
        for (unsigned j = 0; j < lanes; j++) {
            uint32_t s = dec_step(x[j], d->tab, d->dst + i + j);
            uint32_t need = s < LOW;
            uint32_t w = p[0] | (uint32_t)p[1] << 8;
            x[j] = need ? (s << 16) | w : s;
            p += 2 * need;
        }
    }
    memcpy(d->x, x, sizeof x);
    d->p = p;
    d->end = end;
    d->i = i;
}

#if MD_RANS16_SIMD
/* spread[m]: for the lanes set in m, the index of the word each takes, in lane order */
static uint32_t spread[256][8];
static pthread_once_t spread_once = PTHREAD_ONCE_INIT;
static void spread_init(void) {
    for (unsigned m = 0; m < 256; m++) {
        unsigned k = 0;
        for (unsigned j = 0; j < 8; j++) spread[m][j] = (m >> j) & 1 ? k++ : 0;
    }
}

/* One group of one plane, eight lanes at a time: gather the table entries, step the
 * states, then give the lanes below LOW the next words in lane order. */
__attribute__((target("avx2"), always_inline)) static inline void dec_group_avx2(__m256i *x, const dec16 *d,
                                                                                const uint8_t **pp, uint8_t *dst,
                                                                                unsigned nv) {
    const uint32_t *tab = d->tab;
    const __m256i mask_slot = _mm256_set1_epi32(SCALE - 1), one = _mm256_set1_epi32(1);
    const __m256i low = _mm256_set1_epi32(LOW), byte = _mm256_set1_epi32(0xff);
    const uint8_t *p = *pp;
    __m256i e[MAX_LANES / 8];
    for (unsigned v = 0; v < nv; v++) {
        e[v] = _mm256_i32gather_epi32((const int *)tab, _mm256_and_si256(x[v], mask_slot), 4);
        __m256i f = _mm256_add_epi32(_mm256_srli_epi32(e[v], 20), one);
        __m256i b = _mm256_and_si256(_mm256_srli_epi32(e[v], 8), mask_slot);
        x[v] = _mm256_add_epi32(_mm256_mullo_epi32(f, _mm256_srli_epi32(x[v], SCALE_BITS)), b);
    }
    /* the symbols: the low byte of each entry, in lane order, 16 at a time */
    for (unsigned v = 0; v < nv; v += 2) {
        __m256i s = _mm256_packus_epi32(_mm256_and_si256(e[v], byte), _mm256_and_si256(e[v + 1], byte));
        s = _mm256_permute4x64_epi64(s, 0xD8);
        _mm_storeu_si128((__m128i *)(dst + 8 * v),
                         _mm_packus_epi16(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1)));
    }
    /* states stay below 2^31, so a signed comparison is exact */
    for (unsigned v = 0; v < nv; v++) {
        __m256i need = _mm256_cmpgt_epi32(low, x[v]);
        unsigned m = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(need));
        __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
        w = _mm256_permutevar8x32_epi32(w, _mm256_loadu_si256((const __m256i *)spread[m]));
        x[v] = _mm256_blendv_epi8(x[v], _mm256_or_si256(_mm256_slli_epi32(x[v], 16), w), need);
        p += 2 * (unsigned)__builtin_popcount(m);
    }
    *pp = p;
}

/* One group of one plane, sixteen lanes at a time (AVX-512): a lane below LOW takes
 * the next word by vpexpandd (the words in lane order, as spread[] does). */
__attribute__((target("avx512f,avx512bw,avx512vl"), always_inline)) static inline void dec_group_avx512(
    __m512i *x, const dec16 *d, const uint8_t **pp, uint8_t *dst, unsigned nv) {
    const __m512i mask_slot = _mm512_set1_epi32(SCALE - 1), one = _mm512_set1_epi32(1);
    const __m512i low = _mm512_set1_epi32(LOW);
    const __m512i dom_start = _mm512_set1_epi32((int)d->dom_start), dom_f = _mm512_set1_epi32((int)d->dom_f);
    const __m128i dom_sym = _mm_set1_epi8((char)d->dom_sym);
    const uint32_t *tab = d->tab;
    const uint8_t *p = *pp;
    for (unsigned v = 0; v < nv; v++) {
        __m512i m = _mm512_and_si512(x[v], mask_slot);
        if (d->dom) {
            /* every slot in the top symbol's range: x = f * (x >> 12) + slot - start */
            __m512i t = _mm512_sub_epi32(m, dom_start);
            if (_mm512_cmplt_epu32_mask(t, dom_f) == 0xffff) {
                x[v] = _mm512_add_epi32(_mm512_mullo_epi32(dom_f, _mm512_srli_epi32(x[v], SCALE_BITS)), t);
                _mm_storeu_si128((__m128i *)(dst + 16 * v), dom_sym);
                continue;
            }
        }
        __m512i e = _mm512_i32gather_epi32(m, (const int *)tab, 4);
        __m512i f = _mm512_add_epi32(_mm512_srli_epi32(e, 20), one);
        __m512i b = _mm512_and_si512(_mm512_srli_epi32(e, 8), mask_slot);
        x[v] = _mm512_add_epi32(_mm512_mullo_epi32(f, _mm512_srli_epi32(x[v], SCALE_BITS)), b);
        _mm_storeu_si128((__m128i *)(dst + 16 * v), _mm512_cvtepi32_epi8(e));
    }
    for (unsigned v = 0; v < nv; v++) {
        __mmask16 need = _mm512_cmplt_epu32_mask(x[v], low);
        __m512i w = _mm512_maskz_expand_epi32(need, _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)));
        x[v] = _mm512_mask_or_epi32(x[v], need, _mm512_slli_epi32(x[v], 16), w);
        p += 2 * (unsigned)__builtin_popcount((unsigned)need);
    }
    *pp = p;
}

/* Whole groups of planes a and b in step while both have them, then of each alone.
 * A plane's groups depend on each other through its states, so one plane keeps the
 * core waiting on gather and multiply latency; two planes' groups are independent
 * and overlap. W is the vector width in lanes, NV the vectors of one plane. */
#define DEC_PAIR(NAME, VEC, W, NV, LOADV, STOREV, GROUP)                                                  \
    static void NAME(dec16 *a, dec16 *b) {                                                                \
        VEC xa[NV], xb[NV];                                                                               \
        const uint8_t *pa = a->p, *ea = a->end, *pb = NULL, *eb = NULL;                                   \
        size_t ia = a->i, ib = 0;                                                                         \
        for (unsigned v = 0; v < NV; v++) xa[v] = LOADV(a->x + W * v);                                    \
        if (b) {                                                                                          \
            pb = b->p;                                                                                    \
            eb = b->end;                                                                                  \
            ib = b->i;                                                                                    \
            for (unsigned v = 0; v < NV; v++) xb[v] = LOADV(b->x + W * v);                                \
            while (dec_ready(a, &pa, &ea, ia) && dec_ready(b, &pb, &eb, ib)) {                            \
                GROUP(xa, a, &pa, a->dst + ia, NV);                                                  \
                GROUP(xb, b, &pb, b->dst + ib, NV);                                                  \
                ia += W * NV;                                                                             \
                ib += W * NV;                                                                             \
            }                                                                                             \
            for (; dec_ready(b, &pb, &eb, ib); ib += W * NV) GROUP(xb, b, &pb, b->dst + ib, NV);     \
            for (unsigned v = 0; v < NV; v++) STOREV(b->x + W * v, xb[v]);                                \
            b->p = pb;                                                                                    \
            b->end = eb;                                                                                  \
            b->i = ib;                                                                                    \
        }                                                                                                 \
        for (; dec_ready(a, &pa, &ea, ia); ia += W * NV) GROUP(xa, a, &pa, a->dst + ia, NV);         \
        for (unsigned v = 0; v < NV; v++) STOREV(a->x + W * v, xa[v]);                                    \
        a->p = pa;                                                                                        \
        a->end = ea;                                                                                      \
        a->i = ia;                                                                                        \
    }
#define LOAD8(p) _mm256_loadu_si256((const __m256i *)(p))
#define STORE8(p, v) _mm256_storeu_si256((__m256i *)(p), (v))
#define LOAD16(p) _mm512_loadu_si512((const void *)(p))
#define STORE16(p, v) _mm512_storeu_si512((void *)(p), (v))
__attribute__((target("avx2"))) DEC_PAIR(dec_avx2_32, __m256i, 8, 4, LOAD8, STORE8, dec_group_avx2)
__attribute__((target("avx2"))) DEC_PAIR(dec_avx2_64, __m256i, 8, 8, LOAD8, STORE8, dec_group_avx2)
__attribute__((target("avx512f,avx512bw,avx512vl")))
DEC_PAIR(dec_avx512_32, __m512i, 16, 2, LOAD16, STORE16, dec_group_avx512)
__attribute__((target("avx512f,avx512bw,avx512vl")))
DEC_PAIR(dec_avx512_64, __m512i, 16, 4, LOAD16, STORE16, dec_group_avx512)
#endif

/* a, and b when not NULL (with the same lanes) */
static void dec_run(dec16 *a, dec16 *b) {
#if MD_RANS16_SIMD
    if (md_cpu_avx512()) {
        (a->lanes == 64 ? dec_avx512_64 : dec_avx512_32)(a, b);
        return;
    }
    if (md_cpu_avx2()) {
        pthread_once(&spread_once, spread_init);
        (a->lanes == 64 ? dec_avx2_64 : dec_avx2_32)(a, b);
        return;
    }
#endif
    dec_groups(a);
    if (b) dec_groups(b);
}

int md_rans16_decode(const uint8_t *src, size_t len, uint8_t *dst, size_t n, unsigned lanes) {
    dec16 *d = malloc(sizeof *d);
    int rc = -1;
    if (d && dec_open(d, src, len, dst, n, lanes) == 0) {
        dec_run(d, NULL);
        rc = dec_finish(d);
    }
    free(d);
    return rc;
}

int md_rans16_decode2(const uint8_t *src_a, size_t len_a, uint8_t *dst_a, const uint8_t *src_b, size_t len_b,
                      uint8_t *dst_b, size_t n, unsigned lanes) {
    dec16 *d = malloc(2 * sizeof *d);
    int rc = -1;
    if (d && dec_open(&d[0], src_a, len_a, dst_a, n, lanes) == 0 &&
        dec_open(&d[1], src_b, len_b, dst_b, n, lanes) == 0) {
        dec_run(&d[0], &d[1]);
        rc = dec_finish(&d[0]) == 0 && dec_finish(&d[1]) == 0 ? 0 : -1;
    }
    free(d);
    return rc;
}
