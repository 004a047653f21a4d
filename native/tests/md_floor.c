/* md_floor: the speed of each stage of the numeric --basis path on 1 MiB of real
 * files, in CPU time (best of many runs, so that a loaded machine still gives the
 * stage's own cost), next to a plain memory copy. Shows the floor under a diff or
 * a patch: every byte of NEW goes through the plane coder once each way.
 *   build/md_floor OLD NEW WIDTH OFFSET        (e.g. an fp32 tensor's offset) */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../src/md_internal.h"

static double cpu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

#define BEST(label, bytes, reps, stmt)                                                   \
    do {                                                                                 \
        double best_ = 1e9;                                                              \
        for (int r_ = 0; r_ < (reps); r_++) {                                            \
            double t0_ = cpu_now();                                                      \
            stmt;                                                                        \
            double t_ = cpu_now() - t0_;                                                 \
            if (t_ < best_) best_ = t_;                                                  \
        }                                                                                \
        printf("%-44s %7.2f GB/s\n", label, (double)(bytes) / best_ / 1e9);              \
    } while (0)

static void counts(const uint8_t *p, size_t n, uint32_t c[256]) {
    memset(c, 0, 256 * sizeof *c);
    for (size_t i = 0; i < n; i++) c[p[i]]++;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: md_floor OLD NEW WIDTH OFFSET\n");
        return 2;
    }
    int fo = open(argv[1], O_RDONLY), fn = open(argv[2], O_RDONLY);
    unsigned w = (unsigned)atoi(argv[3]);
    uint64_t off = strtoull(argv[4], NULL, 10);
    const size_t L = (size_t)1 << 20, P = L / (w ? w : 1);
    if (fo < 0 || fn < 0 || (w != 2 && w != 4 && w != 8)) {
        fprintf(stderr, "md_floor: cannot open the files, or WIDTH is not 2, 4 or 8\n");
        return 2;
    }
    uint8_t *o = malloc(L), *n = malloc(L), *pl = malloc(L), *back = malloc(L), *cpy = malloc(L);
    uint8_t *enc[8], *dec = malloc(L), h[16];
    size_t z[8];
    uint32_t c[8][256];
    if (md_pread_full(fo, o, L, off) != (int64_t)L || md_pread_full(fn, n, L, off) != (int64_t)L) {
        fprintf(stderr, "md_floor: the files hold less than 1 MiB from OFFSET\n");
        return 2;
    }
    BEST("memcpy (a plain copy in memory)", L, 300, memcpy(cpy, n, L));
    BEST("pread of 1 MiB (page cache)", L, 100, (void)md_pread_full(fn, cpy, L, off));
    BEST("XXH3-128 (digest, basis check)", L, 300, md_h128(n, L, h));
    BEST("numeric model: NEW - OLD, zigzag, planes", L, 300, md_num_encode(o, n, L, w, pl));
    BEST("numeric model, inverse", L, 300, md_num_decode(o, pl, L, w, back));
    for (unsigned k = 0; k < w; k++) {
        counts(pl + k * P, P, c[k]);
        enc[k] = malloc(P);
    }
    BEST("rANS-32 encode, planes one at a time", L, 50,
         for (unsigned k = 0; k < w; k++) z[k] = md_rans16_encode(pl + k * P, P, c[k], enc[k], P));
    BEST("rANS-32 encode, planes two at a time", L, 50,
         for (unsigned k = 0; k + 1 < w; k += 2) md_rans16_encode2(pl + k * P, c[k], enc[k], &z[k], pl + (k + 1) * P,
                                                                   c[k + 1], enc[k + 1], &z[k + 1], P, P));
    /* a plane that does not shrink goes raw in a delta: only the coded ones decode */
    unsigned coded[8], m = 0;
    for (unsigned k = 0; k < w; k++)
        if (z[k]) coded[m++] = k;
    BEST("rANS-32 decode, planes one at a time", (size_t)m * P, 50,
         for (unsigned j = 0; j < m; j++) (void)md_rans16_decode(enc[coded[j]], z[coded[j]], dec + coded[j] * P, P));
    if (m >= 2)
        BEST("rANS-32 decode, planes two at a time", (size_t)(m & ~1u) * P, 50,
             for (unsigned j = 0; j + 1 < m; j += 2) (void)md_rans16_decode2(
                 enc[coded[j]], z[coded[j]], dec + coded[j] * P, enc[coded[j + 1]], z[coded[j + 1]],
                 dec + coded[j + 1] * P, P));
    for (unsigned j = 0; j < m; j++)
        if (memcmp(dec + coded[j] * P, pl + coded[j] * P, P) != 0) {
            fprintf(stderr, "md_floor: a plane's round trip failed\n");
            return 1;
        }
    if (memcmp(back, n, L) != 0) {
        fprintf(stderr, "md_floor: the numeric model's round trip failed\n");
        return 1;
    }
    size_t total = 0;
    for (unsigned k = 0; k < w; k++) total += z[k] ? z[k] : P;
    printf("%-44s %7.3f (%u of %u planes coded)\n", "planes / raw", (double)total / (double)L, m, w);
    return 0;
}
