/*
 * meridian_delta: a streaming rsync-family delta engine.
 *
 * Three operations, each over plain file descriptors:
 *   md_signature(OLD -> SIG)      one sequential pass over OLD;
 *   md_delta(SIG, NEW -> DELTA)   one sequential pass over NEW, holding only the
 *                                 signature table and a bounded window;
 *   md_delta_basis(OLD, NEW -> DELTA)  the same with OLD at hand: numeric deltas;
 *   md_patch(OLD, DELTA -> OUT)   one sequential pass over DELTA (a pipe or socket is
 *                                 fine), random reads of OLD.
 *
 * Guarantees (see native/FORMAT.md for the bytes):
 *   - Output is byte-identical for any thread count.
 *   - Every length in a signature or delta is validated before use; a hostile or
 *     corrupt input is rejected with MD_E_CORRUPT_* / MD_E_TRUNCATED_* and can
 *     never make the engine read outside OLD, write outside the output, or
 *     allocate more than a bounded multiple of the bytes it has actually read.
 *   - md_patch refuses an OLD whose length differs from the one the delta was made
 *     against before writing anything, and (version 2) an OLD whose bytes differ
 *     from the basis in any range a frame reads: each frame carries a hash of
 *     those ranges, checked before the frame's bytes are written into a pipe, or
 *     after them into a regular output that started empty, which is then truncated
 *     back to empty (MD_E_WRONG_BASIS). It verifies the digest of what it wrote
 *     against the delta's trailer, and never writes more than opt->max_output.
 *     OLD is read with pread, never mapped: another process truncating it makes the
 *     patch fail (MD_E_IO), not the process die of SIGBUS.
 *   - Memory: a working set of at most about 40 MiB plus the signature table.
 * The functions are thread-safe (no global state, no environment variables) and
 * never call back into the caller; progress is published through an optional counter (bytes of input
 * consumed so far) that another thread may read.
 */
#ifndef MERIDIAN_DELTA_H
#define MERIDIAN_DELTA_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MD_VERSION 2 /* of the delta format written; version 1 deltas still patch */

typedef enum md_status {
    MD_OK = 0,
    MD_E_IO = 1,               /* a read or write failed; errno is in md_error.sys_errno */
    MD_E_CORRUPT_SIGNATURE = 2,/* the signature is malformed, truncated or fails its checksum */
    MD_E_CORRUPT_DELTA = 3,    /* the delta is malformed or fails a checksum */
    MD_E_TRUNCATED_DELTA = 4,  /* the delta ends before its END frame */
    MD_E_WRONG_BASIS = 5,      /* OLD is not the file the delta was made against */
    MD_E_INVALID = 6,          /* a bad argument (block size, thread count) */
    MD_E_NOMEM = 7,            /* an allocation failed */
    MD_E_LIMIT = 8,            /* patch: the output would exceed md_options.max_output */
    MD_E_CANCELLED = 9         /* md_options.cancel was set */
} md_status;

typedef struct md_error {
    int sys_errno;             /* for MD_E_IO */
    char message[256];         /* one sentence, no trailing newline */
} md_error;

typedef struct md_options {
    uint32_t threads;          /* worker threads, 0 or 1 = the calling thread only; at most
                                  MD_MAX_WORKERS (the memory bound): more is MD_E_INVALID */
    uint32_t block_len;        /* signature only: 0 = chosen from the file size */
    volatile uint64_t *progress; /* optional: bytes of the main input consumed so far */
    uint32_t flags;            /* MD_DURABLE | MD_PORTABLE, or 0 */
    uint32_t elem_width;       /* delta_basis: bytes per element of a raw file (1, 2, 4, 8),
                                  or 0 = detect safetensors (else no numeric model) */
    uint64_t max_output;       /* patch: refuse to write more than this; 0 = no cap */
    volatile int *cancel;      /* optional: set nonzero from another thread to stop */
} md_options;

#define MD_MAX_WORKERS 4u

/* md_patch: the caller will fsync the output, so start its writeback while patching
 * (sync_file_range every 1 MiB) and the final fsync waits only for the tail. Costs
 * CPU when nobody fsyncs, hence opt-in. */
#define MD_DURABLE 1u
/* Use the portable code instead of the AVX2 kernels (same bytes; for tests). */
#define MD_PORTABLE 2u

typedef struct md_stats {
    uint64_t input_bytes;      /* OLD for signature, NEW for delta, DELTA for patch */
    uint64_t output_bytes;     /* bytes written */
    uint64_t copy_bytes;       /* delta: bytes of NEW found in OLD */
    uint64_t literal_bytes;    /* delta: bytes of NEW sent as literals */
    uint64_t numeric_bytes;    /* delta_basis: bytes of NEW sent as numeric differences */
    uint32_t threads;          /* worker threads used */
    uint32_t block_len;
    uint32_t strong_len;
} md_stats;

#define MD_MIN_BLOCK_LEN 256u
#define MD_MAX_BLOCK_LEN (1u << 20)

/* The block length md_signature picks for a file of `file_len` bytes. */
uint32_t md_default_block_len(uint64_t file_len);

md_status md_signature(int old_fd, int sig_fd, const md_options *opt, md_stats *stats,
                       md_error *err);
md_status md_delta(int sig_fd, int new_fd, int delta_fd, const md_options *opt,
                   md_stats *stats, md_error *err);
/* md_delta with OLD itself at hand instead of its signature (both regular files):
 * numeric frames where NEW's tensors line up with OLD's (safetensors, or
 * opt->elem_width for a raw file), copies where bytes are equal, literals elsewhere;
 * each region takes whichever writes fewer bytes. Without a numeric model it is
 * md_delta against a signature of OLD made in memory. */
md_status md_delta_basis(int old_fd, int new_fd, int delta_fd, const md_options *opt,
                         md_stats *stats, md_error *err);
md_status md_patch(int old_fd, int delta_fd, int out_fd, const md_options *opt,
                   md_stats *stats, md_error *err);

/* Readers exposed for tests and fuzzing: parse and validate a whole signature. */
typedef struct md_sig md_sig;
md_status md_sig_load(int sig_fd, md_sig **out, md_error *err);
void md_sig_free(md_sig *sig);
uint64_t md_sig_block_count(const md_sig *sig);

#ifdef __cplusplus
}
#endif
#endif
