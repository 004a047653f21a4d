/* XXH3 with libxxhash's AVX2 kernel (md_hash_kernel.h), for CPUs with AVX2. */
#define MD_HK_TARGET "avx2"
#define MD_HK_VECTOR 2 /* XXH_AVX2 */
#define MD_HK(name) md_avx2_##name
#include "md_hash_kernel.h"
typedef int md_hash_avx2_unused; /* ISO C forbids an empty translation unit */
