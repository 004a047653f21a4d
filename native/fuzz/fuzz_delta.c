/* libFuzzer harness for the delta reader: md_patch of arbitrary bytes against a
 * fixed 4 KiB basis. The harness writes the basis length into the header so the
 * fuzzer reaches the frames; checksums are off in this build
 * (FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION). Each input is patched with one thread and
 * with two (numeric planes and zstd literals decoded on a second thread), into an
 * empty output (checked as it is written) and into one that is not (checked before
 * each frame is written); each pair must agree on the status, the message and the
 * output's length. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../src/md_internal.h"

#define BASIS_LEN 4096

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int old_fd = -1, delta_fd = -1, out_fd = -1;
    static uint8_t scratch[1 << 17];
    if (old_fd < 0) {
        uint8_t basis[BASIS_LEN];
        for (size_t i = 0; i < BASIS_LEN; i++) basis[i] = (uint8_t)(i * 7 + i / 256);
        old_fd = memfd_create("fuzz_old", 0);
        delta_fd = memfd_create("fuzz_delta", 0);
        out_fd = memfd_create("fuzz_out", 0);
        if (write(old_fd, basis, BASIS_LEN) != BASIS_LEN) abort();
    }
    if (size > sizeof scratch) return 0;
    memcpy(scratch, data, size);
    if (size >= MD_HEADER_LEN) md_put_u64(scratch + 16, BASIS_LEN);
    if (ftruncate(delta_fd, 0) != 0) abort();
    if (pwrite(delta_fd, scratch, size, 0) != (ssize_t)size) abort();
    for (int rewindable = 1; rewindable >= 0; rewindable--) {
        md_status rc[2];
        md_error err[2];
        off_t out_len[2];
        for (uint32_t t = 0; t < 2; t++) {
            if (ftruncate(out_fd, 0) != 0) abort();
            lseek(delta_fd, 0, SEEK_SET);
            lseek(out_fd, 0, SEEK_SET);
            if (!rewindable && write(out_fd, "x", 1) != 1) abort();
            md_options opt = {.threads = t + 1, .block_len = 0, .flags = 0};
            memset(&err[t], 0, sizeof err[t]);
            rc[t] = md_patch(old_fd, delta_fd, out_fd, &opt, NULL, &err[t]);
            struct stat st;
            if (fstat(out_fd, &st) != 0) abort();
            out_len[t] = st.st_size;
        }
        if (rc[0] != rc[1] || out_len[0] != out_len[1] || strcmp(err[0].message, err[1].message) != 0) abort();
    }
    return 0;
}
