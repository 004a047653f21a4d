/* An order-0 rANS coder for the byte planes of numeric frames.
 *
 * Why not only zstd: a plane of zigzag differences is close to memoryless, so what
 * counts is coding each byte near its entropy. zstd's literals are Huffman-coded,
 * which cannot spend less than one bit on a byte: the high plane of bf16 changes
 * (mostly 0, 1 or 2) costs zstd about 6% more than its entropy. rANS spends
 * fractional bits. Four interleaved states share one byte stream so that the
 * dependency chains overlap.
 *
 * Layout (FORMAT.md): 256 frequencies as LEB128 varints summing to 4096, then the
 * four final states (u32 each), then the renormalization bytes. The decoder checks
 * every frequency and state, never reads past the plane, and requires the stream to
 * end exactly where the encoder began (all bytes used, every state back at L). */
#include <stdlib.h>
#include <string.h>

#include "md_internal.h"

#define SCALE_BITS 12u
#define SCALE (1u << SCALE_BITS)
#define RANS_L (1u << 23) /* lower bound of a state; states live in [L, 256 L) */
#define WAYS 4u

/* Counts scaled to sum to SCALE, every present symbol at least 1. */
void md_rans_normalize(const uint32_t count[256], size_t n, uint32_t freq[256]) {
    uint32_t total = 0;
    int biggest = 0;
    for (int s = 0; s < 256; s++) {
        freq[s] = count[s] ? (uint32_t)(((uint64_t)count[s] * SCALE) / n) : 0;
        if (count[s] && !freq[s]) freq[s] = 1;
        total += freq[s];
        if (freq[s] > freq[biggest]) biggest = s;
    }
    /* Settle the rounding on the most frequent symbol, where it costs least; if it
     * cannot absorb all of an excess, take from the others while they stay >= 1. */
    if (total < SCALE) {
        freq[biggest] += SCALE - total;
    } else {
        uint32_t excess = total - SCALE;
        while (excess) {
            for (int s = 0; s < 256 && excess; s++) {
                uint32_t room = freq[s] > 1 ? freq[s] - 1 : 0;
                if (s != biggest && room > freq[s] / 2) room = freq[s] / 2;
                uint32_t take = room < excess ? room : excess;
                freq[s] -= take;
                excess -= take;
            }
        }
    }
}

size_t md_rans_bound(size_t n) { return 256 * 2 + WAYS * 4 + n + n / 16 + 64; }

/* Division-free encoding: x / f as a multiply by a rounded-up reciprocal and a
 * shift, exact for every state below 2^31 (the bound states keep). */
typedef struct enc_sym {
    uint32_t x_max, rcp, bias;
    uint16_t cmpl, shift;
} enc_sym;

static void enc_sym_init(enc_sym *e, uint32_t start, uint32_t f) {
    e->x_max = ((RANS_L >> SCALE_BITS) << 8) * f;
    e->cmpl = (uint16_t)(SCALE - f);
    if (f < 2) { /* f = 1: x / 1 = x, done as x * (2^32 - 1) >> 32 = x - 1 plus the bias */
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

static inline uint32_t enc_put(uint32_t x, const enc_sym *e, uint8_t **p) {
    while (x >= e->x_max) {
        *--*p = (uint8_t)x;
        x >>= 8;
    }
    uint32_t q = (uint32_t)(((uint64_t)x * e->rcp) >> 32) >> e->shift;
    return x + e->bias + q * e->cmpl;
}

size_t md_rans_encode(const uint8_t *src, size_t n, const uint32_t count[256], uint8_t *dst, size_t cap) {
    uint32_t freq[256];
    enc_sym sym[256];
    if (!n || cap < md_rans_bound(n)) return 0;
    md_rans_normalize(count, n, freq);
    uint32_t acc = 0;
    size_t hdr = 0;
    for (int s = 0; s < 256; s++) {
        enc_sym_init(&sym[s], acc, freq[s] ? freq[s] : 1);
        acc += freq[s];
        hdr += md_put_varint(dst + hdr, freq[s]);
    }
    /* The byte stream grows down from the end of dst; it is moved up afterwards. Each
     * symbol emits at most 2 bytes per state, so checking once per four symbols that 8
     * bytes remain above the header keeps every write inside dst. */
    uint8_t *end = dst + cap, *p = end, *floor = dst + hdr + WAYS * 4 + 8;
    uint32_t x0 = RANS_L, x1 = RANS_L, x2 = RANS_L, x3 = RANS_L;
    size_t i = n;
    while (i % WAYS) {
        i--;
        uint32_t *x = i % WAYS == 0 ? &x0 : i % WAYS == 1 ? &x1 : &x2;
        *x = enc_put(*x, &sym[src[i]], &p);
    }
    while (i) {
        if (p < floor) return 0;
        i -= 4;
        x3 = enc_put(x3, &sym[src[i + 3]], &p);
        x2 = enc_put(x2, &sym[src[i + 2]], &p);
        x1 = enc_put(x1, &sym[src[i + 1]], &p);
        x0 = enc_put(x0, &sym[src[i]], &p);
    }
    if (p < floor) return 0;
    size_t stream = (size_t)(end - p);
    uint8_t *o = dst + hdr;
    md_put_u32(o, x0);
    md_put_u32(o + 4, x1);
    md_put_u32(o + 8, x2);
    md_put_u32(o + 12, x3);
    memmove(o + WAYS * 4, p, stream);
    return hdr + WAYS * 4 + stream;
}

typedef struct dec_slot {
    uint16_t freq, bias; /* bias = slot - start of its symbol */
    uint8_t sym;
} dec_slot;

#define DEC(x, i)                                                  \
    do {                                                           \
        const dec_slot *d = &slot[(x) & (SCALE - 1)];              \
        (x) = (uint32_t)d->freq * ((x) >> SCALE_BITS) + d->bias;    \
        dst[i] = d->sym;                                           \
        while ((x) < RANS_L) {                                     \
            if (p == end) return -1;                               \
            (x) = ((x) << 8) | *p++;                               \
        }                                                          \
    } while (0)

int md_rans_decode(const uint8_t *src, size_t len, uint8_t *dst, size_t n) {
    dec_slot slot[SCALE];
    uint32_t acc = 0;
    size_t at = 0;
    for (int s = 0; s < 256; s++) {
        uint64_t f;
        size_t used = md_get_varint(src + at, len - at, &f);
        if (!used || f > SCALE - acc) return -1;
        at += used;
        for (uint32_t k = 0; k < f; k++) slot[acc + k] = (dec_slot){(uint16_t)f, (uint16_t)k, (uint8_t)s};
        acc += (uint32_t)f;
    }
    if (acc != SCALE || len - at < WAYS * 4) return -1;
    uint32_t x0 = md_get_u32(src + at), x1 = md_get_u32(src + at + 4);
    uint32_t x2 = md_get_u32(src + at + 8), x3 = md_get_u32(src + at + 12);
    /* A state is below 2^31 after any encode step (so the encoder's reciprocal is exact). */
    if (x0 < RANS_L || x1 < RANS_L || x2 < RANS_L || x3 < RANS_L || ((x0 | x1 | x2 | x3) >> 31)) return -1;
    at += WAYS * 4;
    const uint8_t *p = src + at, *end = src + len;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        DEC(x0, i);
        DEC(x1, i + 1);
        DEC(x2, i + 2);
        DEC(x3, i + 3);
    }
    if (i < n) DEC(x0, i);
    if (i + 1 < n) DEC(x1, i + 1);
    if (i + 2 < n) DEC(x2, i + 2);
    if (p != end || x0 != RANS_L || x1 != RANS_L || x2 != RANS_L || x3 != RANS_L) return -1;
    return 0;
}
