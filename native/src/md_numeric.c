/* The numeric model of v2 deltas: NEW - OLD element by element, as integers of the
 * element's width (so it is exact for any bit pattern: NaNs, infinities, -0 and
 * denormals are just integers), zigzag-coded so small changes either way have
 * small codes, and split into byte planes so that the entropy coder sees the
 * nearly constant high bytes apart from the noisy low ones. Elements are
 * little-endian, as safetensors stores them; bytes are composed explicitly so the
 * result does not depend on the host's byte order. */
#include <string.h>

#include "md_internal.h"

#define ENCODE(T, W, SHIFT)                                                       \
    do {                                                                          \
        for (size_t i = 0; i < n; i++) {                                          \
            T o = 0, v = 0;                                                       \
            for (unsigned b = 0; b < W; b++) {                                    \
                o |= (T)old[i * W + b] << (8 * b);                                \
                v |= (T)nw[i * W + b] << (8 * b);                                 \
            }                                                                     \
            T d = (T)(v - o);                                                     \
            T z = (T)((T)(d << 1) ^ (T)(0 - (d >> SHIFT)));                       \
            for (unsigned b = 0; b < W; b++) planes[b * n + i] = (uint8_t)(z >> (8 * b)); \
        }                                                                         \
    } while (0)

#define DECODE(T, W)                                                              \
    do {                                                                          \
        for (size_t i = 0; i < n; i++) {                                          \
            T o = 0, z = 0;                                                       \
            for (unsigned b = 0; b < W; b++) {                                    \
                o |= (T)old[i * W + b] << (8 * b);                                \
                z |= (T)planes[b * n + i] << (8 * b);                             \
            }                                                                     \
            T v = (T)(o + (T)((z >> 1) ^ (T)(0 - (z & 1))));                      \
            for (unsigned b = 0; b < W; b++) out[i * W + b] = (uint8_t)(v >> (8 * b)); \
        }                                                                         \
    } while (0)

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
/* On a little-endian host the element is a plain load: loops the compiler vectorizes
 * (the byte-composing ones above run at a fifth of the speed for 16-bit elements). */
#define FAST(T, SHIFT)                                                                \
    static void enc_##T(const uint8_t *restrict old, const uint8_t *restrict nw, size_t n, \
                        uint8_t *restrict planes) {                                   \
        for (size_t i = 0; i < n; i++) {                                              \
            T o, v;                                                                   \
            memcpy(&o, old + i * sizeof(T), sizeof(T));                               \
            memcpy(&v, nw + i * sizeof(T), sizeof(T));                                \
            T d = (T)(v - o);                                                         \
            T zz = (T)((T)(d << 1) ^ (T)(0 - (T)(d >> SHIFT)));                       \
            for (unsigned b = 0; b < sizeof(T); b++) planes[b * n + i] = (uint8_t)(zz >> (8 * b)); \
        }                                                                             \
    }                                                                                 \
    static void dec_##T(const uint8_t *restrict old, const uint8_t *restrict planes, size_t n, \
                        uint8_t *restrict out) {                                      \
        for (size_t i = 0; i < n; i++) {                                              \
            T o, zz = 0;                                                              \
            memcpy(&o, old + i * sizeof(T), sizeof(T));                               \
            for (unsigned b = 0; b < sizeof(T); b++) zz |= (T)((T)planes[b * n + i] << (8 * b)); \
            T v = (T)(o + (T)((T)(zz >> 1) ^ (T)(0 - (T)(zz & 1))));                  \
            memcpy(out + i * sizeof(T), &v, sizeof(T));                               \
        }                                                                             \
    }
FAST(uint16_t, 15)
FAST(uint32_t, 31)
FAST(uint64_t, 63)
#define MD_NUM_FAST 1
#else
#define MD_NUM_FAST 0
#endif

void md_num_encode(const uint8_t *restrict old, const uint8_t *restrict nw, size_t len, unsigned width,
                   uint8_t *restrict planes) {
    size_t n = len / width;
#if MD_NUM_FAST
    if (width == 2) {
        enc_uint16_t(old, nw, n, planes);
        return;
    }
    if (width == 4) {
        enc_uint32_t(old, nw, n, planes);
        return;
    }
    if (width == 8) {
        enc_uint64_t(old, nw, n, planes);
        return;
    }
#endif
    switch (width) {
    case 1: ENCODE(uint8_t, 1, 7); break;
    case 2: ENCODE(uint16_t, 2, 15); break;
    case 4: ENCODE(uint32_t, 4, 31); break;
    default: ENCODE(uint64_t, 8, 63); break;
    }
}

void md_num_decode(const uint8_t *restrict old, const uint8_t *restrict planes, size_t len, unsigned width,
                   uint8_t *restrict out) {
    size_t n = len / width;
#if MD_NUM_FAST
    if (width == 2) {
        dec_uint16_t(old, planes, n, out);
        return;
    }
    if (width == 4) {
        dec_uint32_t(old, planes, n, out);
        return;
    }
    if (width == 8) {
        dec_uint64_t(old, planes, n, out);
        return;
    }
#endif
    switch (width) {
    case 1: DECODE(uint8_t, 1); break;
    case 2: DECODE(uint16_t, 2); break;
    case 4: DECODE(uint32_t, 4); break;
    default: DECODE(uint64_t, 8); break;
    }
}
