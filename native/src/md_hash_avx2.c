/* XXH3-128 compiled from libxxhash's own header (XXH_INLINE_ALL) with its AVX2
 * kernel, for CPUs that have AVX2: Debian's shared libxxhash is built for the
 * x86-64 baseline (SSE2) and hashes about 3x slower. md_common.c picks this
 * or the shared library at run time; both compute the same XXH3-128. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/* xxhash.h only includes the intrinsics when __AVX2__ is set, which GCC's target
 * pragma does and clang's attribute does not: include them ourselves. */
#include <immintrin.h>
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2")
#endif
#define XXH_INLINE_ALL
#define XXH_VECTOR 2 /* XXH_AVX2 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

void md_avx2_h128(const void *p, size_t n, uint8_t out[16]);
void *md_avx2_state_new(void);
void md_avx2_state_free(void *s);
void md_avx2_state_reset(void *s);
void md_avx2_state_update(void *s, const void *p, size_t n);
void md_avx2_state_digest(void *s, uint8_t out[16]);
uint64_t md_avx2_h64(const void *p, size_t n, uint64_t seed);

void md_avx2_h128(const void *p, size_t n, uint8_t out[16]) {
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(p, n));
    memcpy(out, c.digest, 16);
}
void *md_avx2_state_new(void) { return XXH3_createState(); }
void md_avx2_state_free(void *s) { XXH3_freeState((XXH3_state_t *)s); }
void md_avx2_state_reset(void *s) { XXH3_128bits_reset((XXH3_state_t *)s); }
void md_avx2_state_update(void *s, const void *p, size_t n) {
    XXH3_128bits_update((XXH3_state_t *)s, p, n);
}
void md_avx2_state_digest(void *s, uint8_t out[16]) {
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest((XXH3_state_t *)s));
    memcpy(out, c.digest, 16);
}
uint64_t md_avx2_h64(const void *p, size_t n, uint64_t seed) { return XXH3_64bits_withSeed(p, n, seed); }

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#else
typedef int md_hash_avx2_unused; /* ISO C forbids an empty translation unit */
#endif
