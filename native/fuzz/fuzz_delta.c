/* libFuzzer harness for the delta reader: md_patch of arbitrary bytes against a
 * fixed 4 KiB basis. The harness writes the basis length into the header so the
 * fuzzer reaches the frames; checksums are off in this build
 * (FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
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
    if (ftruncate(delta_fd, 0) != 0 || ftruncate(out_fd, 0) != 0) abort();
    if (pwrite(delta_fd, scratch, size, 0) != (ssize_t)size) abort();
    lseek(delta_fd, 0, SEEK_SET);
    lseek(out_fd, 0, SEEK_SET);
    md_options opt = {.threads = 1, .block_len = 0, .flags = 0};
    md_error err;
    md_patch(old_fd, delta_fd, out_fd, &opt, NULL, &err);
    return 0;
}
