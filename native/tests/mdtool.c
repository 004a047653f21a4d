/* mdtool: a thin command line over the library, for benchmarks and debugging.
 *   mdtool signature OLD SIG [threads] [block_len]
 *   mdtool delta SIG NEW DELTA [threads]
 *   mdtool basis OLD NEW DELTA [threads] [element width]
 *   mdtool patch OLD DELTA OUT [threads] [max output bytes]                 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "meridian_delta.h"

int main(int argc, char **argv) {
    md_error err = {0};
    md_stats st = {0};
    md_options opt = {0};
    md_status rc;
    if (argc < 4) {
        fprintf(stderr, "usage: mdtool signature|delta|patch ...\n");
        return 2;
    }
    if (!strcmp(argv[1], "signature")) {
        opt.threads = argc > 4 ? (uint32_t)atoi(argv[4]) : 1;
        opt.block_len = argc > 5 ? (uint32_t)atoi(argv[5]) : 0;
        int a = open(argv[2], O_RDONLY), b = open(argv[3], O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (a < 0 || b < 0) { perror("open"); return 1; }
        rc = md_signature(a, b, &opt, &st, &err);
    } else if (argc >= 5 && !strcmp(argv[1], "delta")) {
        opt.threads = argc > 5 ? (uint32_t)atoi(argv[5]) : 1;
        int a = open(argv[2], O_RDONLY), b = open(argv[3], O_RDONLY);
        int c = open(argv[4], O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (a < 0 || b < 0 || c < 0) { perror("open"); return 1; }
        rc = md_delta(a, b, c, &opt, &st, &err);
    } else if (argc >= 5 && !strcmp(argv[1], "basis")) {
        opt.threads = argc > 5 ? (uint32_t)atoi(argv[5]) : 1;
        opt.elem_width = argc > 6 ? (uint32_t)atoi(argv[6]) : 0;
        int a = open(argv[2], O_RDONLY), b = open(argv[3], O_RDONLY);
        int c = open(argv[4], O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (a < 0 || b < 0 || c < 0) { perror("open"); return 1; }
        rc = md_delta_basis(a, b, c, &opt, &st, &err);
    } else if (argc >= 5 && !strcmp(argv[1], "patch")) {
        opt.threads = argc > 5 ? (uint32_t)atoi(argv[5]) : 1;
        opt.max_output = argc > 6 ? strtoull(argv[6], NULL, 10) : 0;
        int a = open(argv[2], O_RDONLY), b = open(argv[3], O_RDONLY);
        int c = open(argv[4], O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (a < 0 || b < 0 || c < 0) { perror("open"); return 1; }
        rc = md_patch(a, b, c, &opt, &st, &err);
    } else {
        fprintf(stderr, "usage: mdtool signature|delta|patch ...\n");
        return 2;
    }
    if (rc != MD_OK) {
        fprintf(stderr, "error %d: %s\n", rc, err.message);
        return 1;
    }
    fprintf(stderr, "in=%llu out=%llu copy=%llu literal=%llu numeric=%llu block=%u strong=%u\n",
            (unsigned long long)st.input_bytes, (unsigned long long)st.output_bytes,
            (unsigned long long)st.copy_bytes, (unsigned long long)st.literal_bytes,
            (unsigned long long)st.numeric_bytes, st.block_len, st.strong_len);
    return 0;
}
