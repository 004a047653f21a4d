/* libFuzzer harness for the safetensors reader and the numeric model behind it:
 * the input is parsed as a safetensors file; then it is diffed with OLD at hand
 * against a copy of itself with some bytes changed (so a header the reader accepts
 * drives the region planner, numeric frames and copies), and the delta must patch
 * back to exactly the changed copy. Any mismatch aborts. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../src/md_internal.h"

static int fd_with(int fd, const uint8_t *p, size_t n) {
    if (ftruncate(fd, 0) != 0 || (n && pwrite(fd, p, n, 0) != (ssize_t)n)) abort();
    lseek(fd, 0, SEEK_SET);
    return fd;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int old_fd = -1, new_fd, delta_fd, out_fd;
    static uint8_t changed[1 << 16], back[1 << 16];
    if (old_fd < 0) {
        old_fd = memfd_create("fuzz_st_old", 0);
        new_fd = memfd_create("fuzz_st_new", 0);
        delta_fd = memfd_create("fuzz_st_delta", 0);
        out_fd = memfd_create("fuzz_st_out", 0);
    }
    if (size > sizeof changed) return 0;
    md_st st;
    if (md_st_parse_mem(data, size, size, &st) == 1) md_st_free(&st);
    memcpy(changed, data, size);
    /* NEW: the data with every 7th byte of its second half nudged (tensor bytes, if any) */
    for (size_t i = size / 2; i < size; i += 7) changed[i] = (uint8_t)(changed[i] + 1);
    fd_with(old_fd, data, size);
    fd_with(new_fd, changed, size);
    fd_with(delta_fd, NULL, 0);
    md_options opt = {.threads = 1};
    md_error err;
    if (md_delta_basis(old_fd, new_fd, delta_fd, &opt, NULL, &err) != MD_OK) abort();
    lseek(delta_fd, 0, SEEK_SET);
    fd_with(out_fd, NULL, 0);
    if (md_patch(old_fd, delta_fd, out_fd, &opt, NULL, &err) != MD_OK) abort();
    if (pread(out_fd, back, sizeof back, 0) != (ssize_t)size || memcmp(back, changed, size) != 0) abort();
    return 0;
}
