/* libFuzzer harness for the signature reader: md_sig_load and md_sig_index on
 * arbitrary bytes. Built with FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION so that
 * checksums do not stop the fuzzer at the door. */
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../src/md_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int fd = -1;
    if (fd < 0) fd = memfd_create("fuzz_sig", 0);
    if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != (ssize_t)size) abort();
    lseek(fd, 0, SEEK_SET);
    md_sig *sig = NULL;
    md_error err;
    if (md_sig_load(fd, &sig, &err) == MD_OK) {
        md_sig_index(sig, &err);
        md_sig_free(sig);
    }
    return 0;
}
