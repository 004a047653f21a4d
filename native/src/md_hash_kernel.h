/* XXH3 compiled from libxxhash's own header (XXH_INLINE_ALL) with one of its SIMD
 * kernels, included by md_hash_avx2.c and md_hash_avx512.c, which set MD_HK_TARGET
 * (the compiler target), MD_HK_VECTOR (xxhash's XXH_VECTOR) and MD_HK(name) (the
 * exported names). Debian's shared libxxhash is built for the x86-64 baseline
 * (SSE2) and hashes about 3x slower than the AVX2 kernel; md_common.c picks a kernel
 * or the shared library at run time. XXH3's result does not depend on the kernel. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/* xxhash.h only includes the intrinsics when __AVX2__ (or __AVX512F__) is set, which
 * GCC's target pragma does and clang's attribute does not: include them ourselves. */
#include <immintrin.h>
/* a #pragma line expands no macro: _Pragma of a string built from MD_HK_TARGET does */
#define MD_HK_STR(x) #x
#define MD_HK_PRAGMA(x) _Pragma(MD_HK_STR(x))
#if defined(__clang__)
MD_HK_PRAGMA(clang attribute push(__attribute__((target(MD_HK_TARGET))), apply_to = function))
#else
#pragma GCC push_options
MD_HK_PRAGMA(GCC target(MD_HK_TARGET))
#endif
#define XXH_INLINE_ALL
#define XXH_VECTOR MD_HK_VECTOR
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

void MD_HK(h128)(const void *p, size_t n, uint8_t out[16]);
void MD_HK(state_reset)(void *s);
void MD_HK(state_update)(void *s, const void *p, size_t n);
void MD_HK(state_digest)(void *s, uint8_t out[16]);
uint64_t MD_HK(h64)(const void *p, size_t n, uint64_t seed);

void MD_HK(h128)(const void *p, size_t n, uint8_t out[16]) {
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(p, n));
    memcpy(out, c.digest, 16);
}
void MD_HK(state_reset)(void *s) { XXH3_128bits_reset((XXH3_state_t *)s); }
void MD_HK(state_update)(void *s, const void *p, size_t n) { XXH3_128bits_update((XXH3_state_t *)s, p, n); }
void MD_HK(state_digest)(void *s, uint8_t out[16]) {
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest((XXH3_state_t *)s));
    memcpy(out, c.digest, 16);
}
uint64_t MD_HK(h64)(const void *p, size_t n, uint64_t seed) { return XXH3_64bits_withSeed(p, n, seed); }

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif
