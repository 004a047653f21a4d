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

#include <pthread.h>
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
#define MD_RANS16_AVX2 0
#endif

/* One plane being encoded: symbols from the last to the first, words growing down
 * from the end of dst (moved up behind the header and states at the end). */
typedef struct enc16 {
    const uint8_t *src;
    size_t i, hdr;
    uint8_t *dst, *end, *p, *floor;
    uint32_t x[LANES];
    esym sym[256];
#if MD_RANS16_AVX2
    esym_v v;
#endif
} enc16;

/* The header and the symbols after the last whole group; 0, or -1 when it does not fit. */
static int enc_open(enc16 *e, const uint8_t *src, size_t n, const uint32_t count[256], uint8_t *dst, size_t cap) {
    uint32_t freq[256];
    if (!n || cap < 256 * 2 + LANES * 4 + GROUP_MAX_BYTES + 2) return -1;
    md_rans_normalize(count, n, freq);
    uint32_t acc = 0;
    e->hdr = 0;
    for (int s = 0; s < 256; s++) {
        esym_init(&e->sym[s], acc, freq[s] ? freq[s] : 1);
        acc += freq[s];
        e->hdr += md_put_varint(dst + e->hdr, freq[s]);
    }
    /* A group writes at most GROUP_MAX_BYTES (plus the one word stored without
     * being emitted), so one check per group keeps every write above the states. */
    e->src = src;
    e->dst = dst;
    e->end = e->p = dst + cap;
    e->floor = dst + e->hdr + LANES * 4 + GROUP_MAX_BYTES + 2;
    if (e->p < e->floor) return -1;
    for (unsigned j = 0; j < LANES; j++) e->x[j] = LOW;
    size_t i = n;
    while (i % LANES) {
        i--;
        e->x[i % LANES] = enc_step(e->x[i % LANES], &e->sym[src[i]], &e->p);
    }
    e->i = i;
    return 0;
}

/* Whole groups, portable code; -1 when the output reaches the floor. */
static int enc_groups(enc16 *e) {
    uint8_t *p = e->p;
    size_t i = e->i;
    while (i) {
        if (p < e->floor) return -1;
        i -= LANES;
        for (unsigned j = LANES; j--;) e->x[j] = enc_step(e->x[j], &e->sym[e->src[i + j]], &p);
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
    for (unsigned j = 0; j < LANES; j++) md_put_u32(o + 4 * j, e->x[j]);
    memmove(o + LANES * 4, e->p, stream);
    return e->hdr + LANES * 4 + stream;
}

#if MD_RANS16_AVX2
__attribute__((target("avx2"))) static void enc_tables(enc16 *e) {
    for (unsigned s = 0; s < 256; s++) {
        e->v.rcp[s] = e->sym[s].rcp;
        e->v.packed[s] = e->sym[s].bias | (uint32_t)e->sym[s].cmpl << 13 | (uint32_t)e->sym[s].shift << 25;
    }
}

/* Whole groups of planes a and b in step (their groups are independent and overlap,
 * where one plane alone waits on its states' multiply chain), then of each alone;
 * a plane that reaches its floor is marked by p < floor and stops. */
__attribute__((target("avx2"))) static void enc_avx2(enc16 *a, enc16 *b) {
    pthread_once(&top_once, top_init);
    const uint32_t(*tp)[8] = (const uint32_t(*)[8])top;
    __m256i xa[LANES / 8], xb[LANES / 8];
    enc_tables(a);
    for (unsigned v = 0; v < LANES / 8; v++) xa[v] = _mm256_loadu_si256((const __m256i *)(a->x + 8 * v));
    uint8_t *pa = a->p, *pb = NULL;
    if (b) {
        enc_tables(b);
        for (unsigned v = 0; v < LANES / 8; v++) xb[v] = _mm256_loadu_si256((const __m256i *)(b->x + 8 * v));
        pb = b->p;
        while (a->i && b->i && pa >= a->floor && pb >= b->floor) {
            a->i -= LANES;
            b->i -= LANES;
            for (unsigned v = LANES / 8; v--;) {
                xa[v] = enc_vec(xa[v], &a->v, a->src + a->i + 8 * v, &pa, tp);
                xb[v] = enc_vec(xb[v], &b->v, b->src + b->i + 8 * v, &pb, tp);
            }
        }
        while (b->i && pb >= b->floor) {
            b->i -= LANES;
            for (unsigned v = LANES / 8; v--;) xb[v] = enc_vec(xb[v], &b->v, b->src + b->i + 8 * v, &pb, tp);
        }
        for (unsigned v = 0; v < LANES / 8; v++) _mm256_storeu_si256((__m256i *)(b->x + 8 * v), xb[v]);
        b->p = pb;
    }
    while (a->i && pa >= a->floor) {
        a->i -= LANES;
        for (unsigned v = LANES / 8; v--;) xa[v] = enc_vec(xa[v], &a->v, a->src + a->i + 8 * v, &pa, tp);
    }
    for (unsigned v = 0; v < LANES / 8; v++) _mm256_storeu_si256((__m256i *)(a->x + 8 * v), xa[v]);
    a->p = pa;
}
#endif

static void enc_run(enc16 *a, enc16 *b) {
#if MD_RANS16_AVX2
    if (md_cpu_avx2()) {
        enc_avx2(a, b);
        return;
    }
#endif
    if (a && enc_groups(a) != 0) a->p = a->floor - 1;
    if (b && enc_groups(b) != 0) b->p = b->floor - 1;
}

size_t md_rans16_encode(const uint8_t *src, size_t n, const uint32_t count[256], uint8_t *dst, size_t cap) {
    enc16 *e = malloc(sizeof *e);
    size_t r = 0;
    if (e && enc_open(e, src, n, count, dst, cap) == 0) {
        enc_run(e, NULL);
        r = enc_close(e);
    }
    free(e);
    return r;
}

void md_rans16_encode2(const uint8_t *src_a, const uint32_t count_a[256], uint8_t *dst_a, size_t *len_a,
                       const uint8_t *src_b, const uint32_t count_b[256], uint8_t *dst_b, size_t *len_b, size_t n,
                       size_t cap) {
    enc16 *e = malloc(2 * sizeof *e);
    *len_a = *len_b = 0;
    if (!e) return;
    int oa = enc_open(&e[0], src_a, n, count_a, dst_a, cap) == 0;
    int ob = enc_open(&e[1], src_b, n, count_b, dst_b, cap) == 0;
    if (oa || ob) enc_run(oa ? &e[0] : &e[1], oa && ob ? &e[1] : NULL);
    if (oa) *len_a = enc_close(&e[0]);
    if (ob) *len_b = enc_close(&e[1]);
    free(e);
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

/* One plane being decoded. A group of LANES symbols reads at most GROUP_MAX_BYTES
 * words from p, so whole groups run without a bounds check while that many bytes
 * are left; then the last bytes move to `pad`, a copy followed by zeros, and groups
 * still run unchecked to the end of the plane (before, the last 64 bytes of a
 * stream went through the checked loop one symbol at a time: on a nearly constant
 * plane, whose 64 bytes code thousands of symbols, that was most of its time). A
 * group that reads past the real end leaves p beyond `end`, which fails the plane. */
typedef struct dec16 {
    uint32_t x[LANES];
    const uint8_t *p, *end;
    uint8_t *dst;
    size_t i, n;
    int in_pad;
    uint32_t tab[SCALE];
    uint8_t pad[2 * GROUP_MAX_BYTES];
} dec16;

static int dec_open(dec16 *d, const uint8_t *src, size_t len, uint8_t *dst, size_t n) {
    size_t at;
    if (build_table(src, len, &at, d->tab) != 0 || len - at < LANES * 4) return -1;
    for (unsigned j = 0; j < LANES; j++) {
        d->x[j] = md_get_u32(src + at + 4 * j);
        if (d->x[j] < LOW || d->x[j] >> 31) return -1;
    }
    d->p = src + at + LANES * 4;
    d->end = src + len;
    d->dst = dst;
    d->i = 0;
    d->n = n;
    d->in_pad = 0;
    return 0;
}

/* Whether the next group may run unchecked (moving to the padded copy if needed). */
static inline int dec_ready(dec16 *d, const uint8_t **p, const uint8_t **end, size_t i) {
    if (i + LANES > d->n) return 0;
    if (*end - *p >= (ptrdiff_t)GROUP_MAX_BYTES) return 1;
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
        uint32_t *s = &d->x[i % LANES];
        *s = dec_step(*s, d->tab, d->dst + i);
        if (*s < LOW) {
            if (end - p < 2) return -1;
            *s = (*s << 16) | p[0] | (uint32_t)p[1] << 8;
            p += 2;
        }
    }
    if (p != end) return -1;
    for (unsigned j = 0; j < LANES; j++)
        if (d->x[j] != LOW) return -1;
    return 0;
}

/* Whole groups of one plane, portable code. */
static void dec_groups(dec16 *d) {
    const uint8_t *p = d->p, *end = d->end;
    size_t i = d->i;
    uint32_t x[LANES];
    memcpy(x, d->x, sizeof x);
    for (; dec_ready(d, &p, &end, i); i += LANES) {
        for (unsigned j = 0; j < LANES; j++) {
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

#if MD_RANS16_AVX2
#include <pthread.h>
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
__attribute__((target("avx2"))) static inline void dec_group_avx2(__m256i *x, const uint32_t *tab,
                                                                 const uint8_t **pp, uint8_t *dst) {
    const __m256i mask_slot = _mm256_set1_epi32(SCALE - 1), one = _mm256_set1_epi32(1);
    const __m256i low = _mm256_set1_epi32(LOW), byte = _mm256_set1_epi32(0xff);
    const uint8_t *p = *pp;
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
        _mm_storeu_si128((__m128i *)(dst + 8 * v),
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
    *pp = p;
}

/* Whole groups of planes a and b in step while both have them, then of each alone.
 * A plane's groups depend on each other through its states, so one plane keeps the
 * core waiting on gather and multiply latency; two planes' groups are independent
 * and overlap (1.6-1.9x the symbols per second of one plane at a time). */
__attribute__((target("avx2"))) static void dec_avx2(dec16 *a, dec16 *b) {
    pthread_once(&spread_once, spread_init);
    __m256i xa[LANES / 8], xb[LANES / 8];
    const uint8_t *pa = a->p, *ea = a->end, *pb = NULL, *eb = NULL;
    size_t ia = a->i, ib = 0;
    for (unsigned v = 0; v < LANES / 8; v++) xa[v] = _mm256_loadu_si256((const __m256i *)(a->x + 8 * v));
    if (b) {
        pb = b->p;
        eb = b->end;
        ib = b->i;
        for (unsigned v = 0; v < LANES / 8; v++) xb[v] = _mm256_loadu_si256((const __m256i *)(b->x + 8 * v));
        while (dec_ready(a, &pa, &ea, ia) && dec_ready(b, &pb, &eb, ib)) {
            dec_group_avx2(xa, a->tab, &pa, a->dst + ia);
            dec_group_avx2(xb, b->tab, &pb, b->dst + ib);
            ia += LANES;
            ib += LANES;
        }
        for (; dec_ready(b, &pb, &eb, ib); ib += LANES) dec_group_avx2(xb, b->tab, &pb, b->dst + ib);
        for (unsigned v = 0; v < LANES / 8; v++) _mm256_storeu_si256((__m256i *)(b->x + 8 * v), xb[v]);
        b->p = pb;
        b->end = eb;
        b->i = ib;
    }
    for (; dec_ready(a, &pa, &ea, ia); ia += LANES) dec_group_avx2(xa, a->tab, &pa, a->dst + ia);
    for (unsigned v = 0; v < LANES / 8; v++) _mm256_storeu_si256((__m256i *)(a->x + 8 * v), xa[v]);
    a->p = pa;
    a->end = ea;
    a->i = ia;
}
#endif

static void dec_run(dec16 *a, dec16 *b) {
#if MD_RANS16_AVX2
    if (md_cpu_avx2()) {
        dec_avx2(a, b);
        return;
    }
#endif
    dec_groups(a);
    if (b) dec_groups(b);
}

int md_rans16_decode(const uint8_t *src, size_t len, uint8_t *dst, size_t n) {
    dec16 *d = malloc(sizeof *d);
    int rc = -1;
    if (d && dec_open(d, src, len, dst, n) == 0) {
        dec_run(d, NULL);
        rc = dec_finish(d);
    }
    free(d);
    return rc;
}

int md_rans16_decode2(const uint8_t *src_a, size_t len_a, uint8_t *dst_a, const uint8_t *src_b, size_t len_b,
                      uint8_t *dst_b, size_t n) {
    dec16 *d = malloc(2 * sizeof *d);
    int rc = -1;
    if (d && dec_open(&d[0], src_a, len_a, dst_a, n) == 0 && dec_open(&d[1], src_b, len_b, dst_b, n) == 0) {
        dec_run(&d[0], &d[1]);
        rc = dec_finish(&d[0]) == 0 && dec_finish(&d[1]) == 0 ? 0 : -1;
    }
    free(d);
    return rc;
}
