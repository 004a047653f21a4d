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

#if MD_NUM_FAST && defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define MD_NUM_VBMI 1
/* 64 bytes at a time (AVX-512 VBMI): the differences and zigzag of 64 / w elements
 * in one vector, then one byte permute that puts byte b of every element together
 * (byte b * 64/w + j of the result is byte b of element j), and each plane's 64/w
 * bytes stored where they go. The compiler's loop above wrote the planes a byte at
 * a time: 14 GB/s on fp32, 8% of a diff of fp32 tensors; this one 36 GB/s. The
 * elements after the last whole vector take a plain loop; the bytes are the same. */
__attribute__((target("avx512f,avx512bw,avx512vbmi"))) static void enc_vbmi(const uint8_t *restrict old,
                                                                           const uint8_t *restrict nw, size_t n,
                                                                           unsigned w, uint8_t *restrict planes) {
    const size_t per = 64 / w; /* elements a vector */
    uint8_t idx[64];
    for (unsigned q = 0; q < 64; q++) idx[q] = (uint8_t)((q % per) * w + q / per);
    const __m512i perm = _mm512_loadu_si512((const void *)idx);
    size_t i = 0;
    for (; i + per <= n; i += per) {
        __m512i o = _mm512_loadu_si512((const void *)(old + i * w));
        __m512i v = _mm512_loadu_si512((const void *)(nw + i * w));
        __m512i z;
        if (w == 2) {
            __m512i d = _mm512_sub_epi16(v, o);
            z = _mm512_xor_si512(_mm512_slli_epi16(d, 1), _mm512_srai_epi16(d, 15));
        } else if (w == 4) {
            __m512i d = _mm512_sub_epi32(v, o);
            z = _mm512_xor_si512(_mm512_slli_epi32(d, 1), _mm512_srai_epi32(d, 31));
        } else {
            __m512i d = _mm512_sub_epi64(v, o);
            z = _mm512_xor_si512(_mm512_slli_epi64(d, 1), _mm512_srai_epi64(d, 63));
        }
        z = _mm512_permutexvar_epi8(perm, z);
        if (w == 2) {
            _mm256_storeu_si256((__m256i *)(planes + i), _mm512_castsi512_si256(z));
            _mm256_storeu_si256((__m256i *)(planes + n + i), _mm512_extracti64x4_epi64(z, 1));
        } else if (w == 4) {
            _mm_storeu_si128((__m128i *)(planes + i), _mm512_castsi512_si128(z));
            _mm_storeu_si128((__m128i *)(planes + n + i), _mm512_extracti32x4_epi32(z, 1));
            _mm_storeu_si128((__m128i *)(planes + 2 * n + i), _mm512_extracti32x4_epi32(z, 2));
            _mm_storeu_si128((__m128i *)(planes + 3 * n + i), _mm512_extracti32x4_epi32(z, 3));
        } else {
            uint8_t t[64];
            _mm512_storeu_si512((void *)t, z);
            for (unsigned b = 0; b < 8; b++) memcpy(planes + b * n + i, t + 8 * b, 8);
        }
    }
    for (; i < n; i++) {
        uint64_t o = 0, v = 0;
        memcpy(&o, old + i * w, w);
        memcpy(&v, nw + i * w, w);
        unsigned bits = 8 * w;
        uint64_t mask = bits == 64 ? ~0ull : (1ull << bits) - 1;
        uint64_t d = (v - o) & mask, sign = (d >> (bits - 1)) & 1;
        uint64_t z = ((d << 1) ^ (0 - sign)) & mask;
        for (unsigned b = 0; b < w; b++) planes[b * n + i] = (uint8_t)(z >> (8 * b));
    }
}

/* The inverse, for the patch: each plane's 64/w bytes loaded into one vector, the
 * inverse byte permute, unzigzag, plus OLD. */
__attribute__((target("avx512f,avx512bw,avx512vbmi"))) static void dec_vbmi(const uint8_t *restrict old,
                                                                           const uint8_t *restrict planes, size_t n,
                                                                           unsigned w, uint8_t *restrict out) {
    const size_t per = 64 / w;
    uint8_t idx[64];
    for (unsigned q = 0; q < 64; q++) idx[q] = (uint8_t)((q % w) * per + q / w);
    const __m512i perm = _mm512_loadu_si512((const void *)idx);
    size_t i = 0;
    for (; i + per <= n; i += per) {
        __m512i z;
        if (w == 2) {
            z = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(planes + i))),
                                   _mm256_loadu_si256((const __m256i *)(planes + n + i)), 1);
        } else if (w == 4) {
            z = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(planes + i)));
            z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(planes + n + i)), 1);
            z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(planes + 2 * n + i)), 2);
            z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(planes + 3 * n + i)), 3);
        } else {
            uint8_t t[64];
            for (unsigned b = 0; b < 8; b++) memcpy(t + 8 * b, planes + b * n + i, 8);
            z = _mm512_loadu_si512((const void *)t);
        }
        z = _mm512_permutexvar_epi8(perm, z);
        __m512i o = _mm512_loadu_si512((const void *)(old + i * w)), v;
        if (w == 2)
            v = _mm512_add_epi16(o, _mm512_xor_si512(_mm512_srli_epi16(z, 1),
                                                     _mm512_sub_epi16(_mm512_setzero_si512(),
                                                                      _mm512_and_si512(z, _mm512_set1_epi16(1)))));
        else if (w == 4)
            v = _mm512_add_epi32(o, _mm512_xor_si512(_mm512_srli_epi32(z, 1),
                                                     _mm512_sub_epi32(_mm512_setzero_si512(),
                                                                      _mm512_and_si512(z, _mm512_set1_epi32(1)))));
        else
            v = _mm512_add_epi64(o, _mm512_xor_si512(_mm512_srli_epi64(z, 1),
                                                     _mm512_sub_epi64(_mm512_setzero_si512(),
                                                                      _mm512_and_si512(z, _mm512_set1_epi64(1)))));
        _mm512_storeu_si512((void *)(out + i * w), v);
    }
    for (; i < n; i++) {
        uint64_t o = 0, z = 0;
        memcpy(&o, old + i * w, w);
        for (unsigned b = 0; b < w; b++) z |= (uint64_t)planes[b * n + i] << (8 * b);
        uint64_t v = o + ((z >> 1) ^ (0 - (z & 1)));
        for (unsigned b = 0; b < w; b++) out[i * w + b] = (uint8_t)(v >> (8 * b));
    }
}
#else
#define MD_NUM_VBMI 0
#endif

void md_num_encode(const uint8_t *restrict old, const uint8_t *restrict nw, size_t len, unsigned width,
                   uint8_t *restrict planes) {
    size_t n = len / width;
#if MD_NUM_VBMI
    if (width >= 2 && md_cpu_avx512vbmi()) {
        enc_vbmi(old, nw, n, width, planes);
        return;
    }
#endif
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
#if MD_NUM_VBMI
    if (width >= 2 && md_cpu_avx512vbmi()) {
        dec_vbmi(old, planes, n, width, out);
        return;
    }
#endif
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
