/* The plane coder of numeric frames since delta engine 2.1 (plane codec 3): order-0
 * rANS with 32 interleaved 32-bit states and 16-bit renormalization.
 *
 * Why not the four-state byte-wise coder (codec 2, md_rans.c, still decoded): its
 * renormalization is a loop of byte reads whose trip count is data-dependent, a
 * mispredicted branch on nearly every symbol of a noisy plane, and four states
 * leave the multiplier idle; it ran at ~230 MB/s each way, 60% of a --basis diff.
 * Here the state interval is [2^15, 2^31) with 16-bit words, so a step reads or
 * writes at most one word (a conditional move, no loop) and the reciprocal of the
 * encoder stays exact (states below 2^31). Thirty-two states give the scalar code
 * enough independent work, and four AVX2 vectors of eight lanes whose dependency
 * chains (gather, multiply) overlap.
 *
 * Layout (FORMAT.md): 256 frequencies as LEB128 varints summing to 4096; 32
 * u32 final states, each in [2^15, 2^31); then 16-bit little-endian words. Symbol i
 * uses state i mod 32; after decoding it, a state below 2^15 takes the next word.
 * The decoder checks every frequency and state, never reads past the plane, and
 * requires the stream to end exactly where the encoder began (all bytes used, every
 * state back at 2^15). */
#include <stdlib.h>
#include <string.h>

#include "md_internal.h"

#define SCALE_BITS 12u
#define SCALE (1u << SCALE_BITS)
#define LOW (1u << 15) /* states live in [LOW, LOW << 16) */
#define LANES 32u
#define GROUP_MAX_BYTES (2u * LANES) /* one group of LANES symbols moves at most this much */

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
#define MD_RANS16_AVX2 1

/* Eight lanes at once, the same arithmetic as enc_step: the symbols' constants
 * gathered from per-field tables, the reciprocal's high half from two 32x32->64
 * multiplies (even lanes, then odd), and the words of the lanes that emit packed
 * in lane order and stored right below p (a 16-byte store ending at p: the bytes
 * under the new p are scratch). The caller keeps 16 bytes of room per vector. */
typedef struct esym_v {
    uint32_t rcp[256];
    uint32_t packed[256]; /* bias (13 bits) | cmpl << 13 (12 bits) | shift << 25 */
} esym_v;

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

/* Whole groups from i down to 0; returns 0, or -1 when the output reaches floor. */
__attribute__((target("avx2"))) static int enc_avx2(uint32_t *xs, const esym *sym, const uint8_t *src, size_t i,
                                                    uint8_t **pp, const uint8_t *floor) {
    esym_v *t = malloc(sizeof *t);
    uint32_t(*top)[8] = malloc(256 * sizeof *top);
    int rc = 0;
    if (!t || !top) {
        rc = -2;
        goto out;
    }
    for (unsigned s = 0; s < 256; s++) {
        t->rcp[s] = sym[s].rcp;
        t->packed[s] = sym[s].bias | (uint32_t)sym[s].cmpl << 13 | (uint32_t)sym[s].shift << 25;
    }
    /* top[m]: the lanes set in m, in order, moved to the top of the vector */
    for (unsigned m = 0; m < 256; m++) {
        unsigned c = (unsigned)__builtin_popcount(m), k = 8 - c;
        for (unsigned j = 0; j < 8; j++) top[m][j] = 0;
        for (unsigned j = 0; j < 8; j++)
            if ((m >> j) & 1) top[m][k++] = j;
    }
    uint8_t *p = *pp;
    __m256i x[LANES / 8];
    for (unsigned v = 0; v < LANES / 8; v++) x[v] = _mm256_loadu_si256((const __m256i *)(xs + 8 * v));
    while (i) {
        if (p < floor) {
            rc = -1;
            break;
        }
        i -= LANES;
        for (unsigned v = LANES / 8; v--;) x[v] = enc_vec(x[v], t, src + i + 8 * v, &p, (const uint32_t(*)[8])top);
    }
    for (unsigned v = 0; v < LANES / 8; v++) _mm256_storeu_si256((__m256i *)(xs + 8 * v), x[v]);
    *pp = p;
out:
    free(t);
    free(top);
    return rc;
}
#else
#define MD_RANS16_AVX2 0
#endif

size_t md_rans16_encode(const uint8_t *src, size_t n, const uint32_t count[256], uint8_t *dst, size_t cap) {
    uint32_t freq[256];
    esym sym[256];
    size_t hdr = 0;
    if (!n || cap < 256 * 2 + LANES * 4 + GROUP_MAX_BYTES + 2) return 0;
    md_rans_normalize(count, n, freq);
    uint32_t acc = 0;
    for (int s = 0; s < 256; s++) {
        esym_init(&sym[s], acc, freq[s] ? freq[s] : 1);
        acc += freq[s];
        hdr += md_put_varint(dst + hdr, freq[s]);
    }
    /* The words grow down from the end of dst and are moved up afterwards; a group
     * writes at most GROUP_MAX_BYTES (plus the one word stored without being
     * emitted), so one check per group keeps every write above the states. */
    uint8_t *end = dst + cap, *p = end, *floor = dst + hdr + LANES * 4 + GROUP_MAX_BYTES + 2;
    uint32_t x[LANES];
    for (unsigned j = 0; j < LANES; j++) x[j] = LOW;
    size_t i = n;
    if (p < floor) return 0;
    while (i % LANES) {
        i--;
        x[i % LANES] = enc_step(x[i % LANES], &sym[src[i]], &p);
    }
#if MD_RANS16_AVX2
    if (i && md_cpu_avx2()) {
        int r = enc_avx2(x, sym, src, i, &p, floor);
        if (r == -1) return 0;
        if (r == 0) i = 0; /* else out of memory for the tables: the portable loop does it */
    }
#endif
    while (i) {
        if (p < floor) return 0;
        i -= LANES;
        for (unsigned j = LANES; j--;) x[j] = enc_step(x[j], &sym[src[i + j]], &p);
    }
    if (p < floor) return 0;
    size_t stream = (size_t)(end - p);
    uint8_t *o = dst + hdr;
    for (unsigned j = 0; j < LANES; j++) md_put_u32(o + 4 * j, x[j]);
    memmove(o + LANES * 4, p, stream);
    return hdr + LANES * 4 + stream;
}

/* A decoding table entry: symbol in bits 0-7, slot - start in bits 8-19, f - 1 in 20-31. */
static int build_table(const uint8_t *src, size_t len, size_t *at, uint32_t *tab) {
    uint32_t acc = 0;
    *at = 0;
    for (uint32_t s = 0; s < 256; s++) {
        uint64_t f;
        size_t used = md_get_varint(src + *at, len - *at, &f);
        if (!used || f > SCALE - acc) return -1;
        *at += used;
        for (uint32_t k = 0; k < f; k++) tab[acc + k] = s | (k << 8) | ((uint32_t)(f - 1) << 20);
        acc += (uint32_t)f;
    }
    return acc == SCALE ? 0 : -1;
}

static inline uint32_t dec_step(uint32_t x, const uint32_t *tab, uint8_t *out) {
    uint32_t e = tab[x & (SCALE - 1)];
    *out = (uint8_t)e;
    return ((e >> 20) + 1) * (x >> SCALE_BITS) + ((e >> 8) & (SCALE - 1));
}

/* The symbols from i on, one at a time with every read checked. */
static int dec_tail(uint32_t *x, const uint32_t *tab, const uint8_t **pp, const uint8_t *end, uint8_t *dst,
                    size_t i, size_t n) {
    const uint8_t *p = *pp;
    for (; i < n; i++) {
        uint32_t *s = &x[i % LANES];
        *s = dec_step(*s, tab, dst + i);
        if (*s < LOW) {
            if (end - p < 2) return -1;
            *s = (*s << 16) | p[0] | (uint32_t)p[1] << 8;
            p += 2;
        }
    }
    *pp = p;
    return 0;
}

#if MD_RANS16_AVX2
/* Eight lanes at once: gather the table entries, step the states, then give the
 * lanes below LOW the next words in lane order (a permutation from a table indexed
 * by the mask spreads consecutive words over those lanes). */
__attribute__((target("avx2"))) static size_t dec_avx2(uint32_t *xs, const uint32_t *tab, const uint8_t **pp,
                                                       const uint8_t *end, uint8_t *dst, size_t n) {
    uint32_t spread[256][8];
    for (unsigned m = 0; m < 256; m++) {
        unsigned k = 0;
        for (unsigned j = 0; j < 8; j++) spread[m][j] = (m >> j) & 1 ? k++ : 0;
    }
    const uint8_t *p = *pp;
    __m256i x[LANES / 8];
    for (unsigned v = 0; v < LANES / 8; v++) x[v] = _mm256_loadu_si256((const __m256i *)(xs + 8 * v));
    const __m256i mask_slot = _mm256_set1_epi32(SCALE - 1), one = _mm256_set1_epi32(1);
    const __m256i low = _mm256_set1_epi32(LOW), byte = _mm256_set1_epi32(0xff);
    size_t i = 0;
    for (; i + LANES <= n && end - p >= (ptrdiff_t)GROUP_MAX_BYTES; i += LANES) {
        __m256i e[LANES / 8];
        for (unsigned v = 0; v < LANES / 8; v++) {
            e[v] = _mm256_i32gather_epi32((const int *)tab, _mm256_and_si256(x[v], mask_slot), 4);
            __m256i f = _mm256_add_epi32(_mm256_srli_epi32(e[v], 20), one);
            __m256i b = _mm256_and_si256(_mm256_srli_epi32(e[v], 8), mask_slot);
            x[v] = _mm256_add_epi32(_mm256_mullo_epi32(f, _mm256_srli_epi32(x[v], SCALE_BITS)), b);
        }
        /* the symbols: the low byte of each entry, in lane order, 16 at a time */
        for (unsigned v = 0; v < LANES / 8; v += 2) {
            __m256i s = _mm256_packus_epi32(_mm256_and_si256(e[v], byte), _mm256_and_si256(e[v + 1], byte));
            s = _mm256_permute4x64_epi64(s, 0xD8);
            _mm_storeu_si128((__m128i *)(dst + i + 8 * v),
                             _mm_packus_epi16(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1)));
        }
        /* states stay below 2^31, so a signed comparison is exact */
        for (unsigned v = 0; v < LANES / 8; v++) {
            __m256i need = _mm256_cmpgt_epi32(low, x[v]);
            unsigned m = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(need));
            __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
            w = _mm256_permutevar8x32_epi32(w, _mm256_loadu_si256((const __m256i *)spread[m]));
            x[v] = _mm256_blendv_epi8(x[v], _mm256_or_si256(_mm256_slli_epi32(x[v], 16), w), need);
            p += 2 * (unsigned)__builtin_popcount(m);
        }
    }
    for (unsigned v = 0; v < LANES / 8; v++) _mm256_storeu_si256((__m256i *)(xs + 8 * v), x[v]);
    *pp = p;
    return i;
}
#endif

int md_rans16_decode(const uint8_t *src, size_t len, uint8_t *dst, size_t n) {
    uint32_t tab[SCALE], x[LANES];
    size_t at;
    if (build_table(src, len, &at, tab) != 0 || len - at < LANES * 4) return -1;
    for (unsigned j = 0; j < LANES; j++) {
        x[j] = md_get_u32(src + at + 4 * j);
        if (x[j] < LOW || x[j] >> 31) return -1;
    }
    at += LANES * 4;
    const uint8_t *p = src + at, *end = src + len;
    size_t i = 0;
#if MD_RANS16_AVX2
    if (md_cpu_avx2()) i = dec_avx2(x, tab, &p, end, dst, n);
#endif
    /* Whole groups while a group's words are surely there, then the checked tail. */
    for (; i + LANES <= n && end - p >= (ptrdiff_t)GROUP_MAX_BYTES; i += LANES) {
        for (unsigned j = 0; j < LANES; j++) {
            uint32_t s = dec_step(x[j], tab, dst + i + j);
            uint32_t need = s < LOW;
            uint32_t w = p[0] | (uint32_t)p[1] << 8;
            x[j] = need ? (s << 16) | w : s;
            p += 2 * need;
        }
    }
    if (dec_tail(x, tab, &p, end, dst, i, n) != 0) return -1;
    if (p != end) return -1;
    for (unsigned j = 0; j < LANES; j++)
        if (x[j] != LOW) return -1;
    return 0;
}
