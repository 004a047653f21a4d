/* md_floor: the speed of each stage of the numeric --basis path on 1 MiB of real
 * files, in CPU time (best of many runs, so that a loaded machine still gives the
 * stage's own cost), next to a plain memory copy. Shows the floor under a diff or
 * a patch: every byte of NEW goes through the plane coder once each way.
 *   build/md_floor OLD NEW WIDTH OFFSET        (e.g. an fp32 tensor's offset)
 * and the whole --basis diff and its patch on one thread, in the library (no
 * interpreter), best CPU time of REPS runs each, the delta and the output written
 * into files of DIR (page cache, no fsync):
 *   build/md_floor --whole OLD NEW DIR [REPS [d|p]]   (d, p: time only the diff, the patch) */
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

static int whole(const char *old_path, const char *new_path, const char *dir, int reps, char only) {
    char dpath[4096], opath[4096];
    snprintf(dpath, sizeof dpath, "%s/md_floor.delta", dir);
    snprintf(opath, sizeof opath, "%s/md_floor.out", dir);
    int fo = open(old_path, O_RDONLY), fn = open(new_path, O_RDONLY);
    int fd = open(dpath, O_RDWR | O_CREAT | O_TRUNC, 0600), fw = open(opath, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fo < 0 || fn < 0 || fd < 0 || fw < 0) {
        fprintf(stderr, "md_floor: cannot open the files\n");
        return 2;
    }
    off_t n = lseek(fn, 0, SEEK_END);
    md_options opt = {0};
    md_stats st;
    md_error err;
    double best_d = 1e9, best_p = 1e9;
    for (int r = 0; r < (only == 'p' ? 1 : reps); r++) {
        if (ftruncate(fd, 0) != 0 || lseek(fd, 0, SEEK_SET) != 0) return 2;
        double t0 = cpu_now();
        md_status rc = md_delta_basis(fo, fn, fd, &opt, &st, &err);
        double t = cpu_now() - t0;
        if (rc != MD_OK) {
            fprintf(stderr, "md_floor: diff failed: %s\n", err.message);
            return 1;
        }
        if (t < best_d) best_d = t;
    }
    off_t dlen = lseek(fd, 0, SEEK_END);
    for (int r = 0; r < (only == 'd' ? 1 : reps); r++) {
        if (ftruncate(fw, 0) != 0 || lseek(fw, 0, SEEK_SET) != 0 || lseek(fd, 0, SEEK_SET) != 0) return 2;
        double t0 = cpu_now();
        md_status rc = md_patch(fo, fd, fw, &opt, &st, &err);
        double t = cpu_now() - t0;
        if (rc != MD_OK) {
            fprintf(stderr, "md_floor: patch failed: %s\n", err.message);
            return 1;
        }
        if (t < best_p) best_p = t;
    }
    printf("diff %6.3f GB/s  patch %6.3f GB/s  (CPU, best of %d)  delta %lld bytes of %lld\n",
           (double)n / best_d / 1e9, (double)n / best_p / 1e9, reps, (long long)dlen, (long long)n);
    return 0;
}

/* what md_basis.c's histogram_all does (eight tables, a word at a time) */
static void counts8(const uint8_t *p, size_t n, uint32_t out[256]) {
    uint32_t h[8][256];
    memset(h, 0, sizeof h);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t v;
        memcpy(&v, p + i, 8);
        for (unsigned b = 0; b < 8; b++) h[b][(v >> (8 * b)) & 0xff]++;
    }
    for (; i < n; i++) h[0][p[i]]++;
    for (int b = 0; b < 256; b++)
        out[b] = h[0][b] + h[1][b] + h[2][b] + h[3][b] + h[4][b] + h[5][b] + h[6][b] + h[7][b];
}

int main(int argc, char **argv) {
    if (argc >= 5 && strcmp(argv[1], "--whole") == 0)
        return whole(argv[2], argv[3], argv[4], argc > 5 ? atoi(argv[5]) : 10, argc > 6 ? argv[6][0] : 0);
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
    /* The encoder's kernels in alternating runs (switch levels: 0 the best kernel,
     * 3 AVX-512 without VBMI, 2 AVX2), so that a load change hits them alike. */
    {
        static const int lv[3] = {0, 3, 2};
        static const char *name[3] = {"best kernel", "AVX-512 gathers", "AVX2"};
        double best[3] = {1e9, 1e9, 1e9};
        for (int r = 0; r < 60; r++)
            for (int l = 0; l < 3; l++) {
                md_set_portable(lv[l]);
                double t0 = cpu_now();
                for (unsigned k = 0; k + 1 < w; k += 2)
                    md_rans16_encode2(pl + k * P, c[k], enc[k], &z[k], pl + (k + 1) * P, c[k + 1], enc[k + 1],
                                      &z[k + 1], P, P, 64);
                double t = cpu_now() - t0;
                if (t < best[l]) best[l] = t;
            }
        md_set_portable(0);
        for (int l = 0; l < 3; l++) {
            char label[64];
            snprintf(label, sizeof label, "rANS-64 encode in pairs, %s", name[l]);
            printf("%-44s %7.2f GB/s\n", label, (double)L / best[l] / 1e9);
        }
    }
    for (unsigned lanes = 32; lanes <= 64; lanes += 32) {
        char label[64];
        snprintf(label, sizeof label, "rANS-%u encode, planes one at a time", lanes);
        BEST(label, L, 50,
             for (unsigned k = 0; k < w; k++) z[k] = md_rans16_encode(pl + k * P, P, c[k], enc[k], P, lanes));
        snprintf(label, sizeof label, "rANS-%u encode, planes two at a time", lanes);
        BEST(label, L, 50,
             for (unsigned k = 0; k + 1 < w; k += 2) md_rans16_encode2(pl + k * P, c[k], enc[k], &z[k],
                                                                       pl + (k + 1) * P, c[k + 1], enc[k + 1],
                                                                       &z[k + 1], P, P, lanes));
        /* a plane that does not shrink goes raw in a delta: only the coded ones decode */
        unsigned coded[8], m = 0;
        for (unsigned k = 0; k < w; k++)
            if (z[k]) coded[m++] = k;
        snprintf(label, sizeof label, "rANS-%u decode, planes one at a time", lanes);
        BEST(label, (size_t)m * P, 50,
             for (unsigned j = 0; j < m; j++)
                 (void)md_rans16_decode(enc[coded[j]], z[coded[j]], dec + coded[j] * P, P, lanes));
        snprintf(label, sizeof label, "rANS-%u decode, planes two at a time", lanes);
        if (m >= 2)
            BEST(label, (size_t)(m & ~1u) * P, 50,
                 for (unsigned j = 0; j + 1 < m; j += 2) (void)md_rans16_decode2(
                     enc[coded[j]], z[coded[j]], dec + coded[j] * P, enc[coded[j + 1]], z[coded[j + 1]],
                     dec + coded[j + 1] * P, P, lanes));
        for (unsigned j = 0; j < m; j++)
            if (memcmp(dec + coded[j] * P, pl + coded[j] * P, P) != 0) {
                fprintf(stderr, "md_floor: a plane's round trip failed\n");
                return 1;
            }
    }
    BEST("histogram of every plane (8 tables)", L, 100, for (unsigned k = 0; k < w; k++) counts8(pl + k * P, P, c[k]));
    if (memcmp(back, n, L) != 0) {
        fprintf(stderr, "md_floor: the numeric model's round trip failed\n");
        return 1;
    }
    size_t total = 0;
    unsigned m = 0;
    for (unsigned k = 0; k < w; k++) {
        total += z[k] ? z[k] : P;
        m += z[k] != 0;
    }
    printf("%-44s %7.3f (%u of %u planes coded)\n", "planes / raw", (double)total / (double)L, m, w);
    return 0;
}
