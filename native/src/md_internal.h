/* Internals shared by the engine's translation units: format constants,
 * little-endian codecs, error helpers, buffered I/O, the tree digest and a
 * tiny parallel-for. Nothing here is part of the public API. */
#ifndef MD_INTERNAL_H
#define MD_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "meridian_delta.h"

/* ---- format constants (native/FORMAT.md) ---- */
#define MD_SIG_MAGIC "MRDNSIG\x01"
#define MD_SIG_VERSION 1u
#define MD_DELTA_MAGIC "MRDNDLT\x02" /* the last byte is the format version */
#define MD_DELTA_MAGIC_LEN 7u          /* the bytes every version shares */
#define MD_HEADER_LEN 64u
#define MD_SIG_FRAME_ENTRIES 4096u
#define MD_CHUNK_LEN ((uint64_t)4 << 20)     /* digest chunk and delta segment */
#define MD_FRAME_MAX_LIT ((uint32_t)1 << 20)  /* literal bytes per delta frame */
#define MD_FRAME_MAX_CMD ((uint32_t)1 << 20)  /* command bytes per delta frame */
#define MD_FRAME_HDR_LEN_V1 32u /* 24 bytes of fields + their own XXH3-64 */
#define MD_FRAME_HDR_LEN 40u    /* v2: 32 bytes of fields (+ the basis check) + XXH3-64 */
#define MD_FRAME_DATA 1u
#define MD_FRAME_END 2u
#define MD_FRAME_NUMERIC 3u     /* v2: element-wise integer differences against OLD */
#define MD_NUMERIC_NO_BASIS 4u  /* NUMERIC param bit: against zeros, OLD not read */
#define MD_CODEC_RAW 0u
#define MD_CODEC_ZSTD 1u
#define MD_END_PAYLOAD_LEN 24u
#define MD_MAX_THREADS 64u /* the parallel-for's own bound; the API refuses more than 4 */
/* Chunks read per round, and so the most workers an operation uses: this is what
 * keeps the working set near 40 MiB whatever the thread count asked for. */
#define MD_ROUND_CHUNKS_MAX 4u
#define MD_ROLL_OFFSET 31u /* added to each byte so runs of zeros still move the sums */
#define MD_FILTER2_MUL 0xC2B2AE3D27D4EB4Full

#ifdef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
#define MD_VERIFY_CHECKSUMS 0
#else
#define MD_VERIFY_CHECKSUMS 1
#endif

static inline void md_put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void md_put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint32_t md_get_u32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}
static inline uint64_t md_get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* ---- errors ---- */
md_status md_fail(md_error *err, md_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
md_status md_fail_io(md_error *err, int sys_errno, const char *what);

/* ---- I/O ---- */
/* Reads up to len bytes, retrying short reads; returns bytes read (< len only at EOF) or -1. */
int64_t md_read_full(int fd, void *buf, size_t len);
int64_t md_pread_full(int fd, void *buf, size_t len, uint64_t off);
int md_write_full(int fd, const void *buf, size_t len);

/* Scratch memory for buffers an operation writes through in full: mapped on 2 MiB
 * boundaries and advised for huge pages (md_common.c says why); NULL when out of
 * memory. Free with the same length. */
void *md_scratch_alloc(size_t len);
void md_scratch_free(void *p, size_t len);

typedef struct md_writer {
    int fd;
    uint8_t *buf;
    size_t len, cap;
    uint64_t total;
    int failed_errno;
    int sparse;       /* regular output file: all-zero runs become holes */
    int ends_in_hole; /* the last bytes were skipped: md_writer_finish sets the length */
    int durable;      /* start writeback as we go (MD_DURABLE): the caller's fsync is shorter */
    int prealloc;     /* sparse: allocate each run (fallocate) just before writing it; off once it fails */
    uint64_t emitted, kicked; /* bytes handed to the file; bytes whose writeback was started */
} md_writer;
int md_writer_init(md_writer *w, int fd, size_t cap);
/* Whether fd's file system gains from prealloc (ext4; md_common.c says why). */
int md_prealloc_pays(int fd);
int md_writer_put(md_writer *w, const void *data, size_t len);
int md_writer_flush(md_writer *w);
/* Flushes and, for a sparse output, sets the file length; call once at the end. */
int md_writer_finish(md_writer *w);
void md_writer_free(md_writer *w);

/* ---- tree digest: XXH3-128 over the XXH3-128 of each 4 MiB chunk, then the length ---- */
typedef struct md_digest {
    void *top;          /* XXH3_state_t for the chunk digests */
    void *chunk;        /* XXH3_state_t for the current chunk (streaming use) */
    uint64_t in_chunk;  /* bytes in the current chunk */
    uint64_t total;
} md_digest;
int md_digest_init(md_digest *d);
void md_digest_free(md_digest *d);
/* Streaming: feed bytes in order. */
void md_digest_update(md_digest *d, const uint8_t *p, size_t len);
/* Parallel use: add one whole chunk's digest (16 bytes, canonical) and its length. */
void md_digest_add_chunk(md_digest *d, const uint8_t chunk_digest[16], uint64_t chunk_len);
void md_chunk_digest(const uint8_t *p, size_t len, uint8_t out[16]);
/* XXH3-128 (canonical bytes) and its streaming state, on the fastest kernel available. */
void md_h128(const void *p, size_t n, uint8_t out[16]);
/* XXH3-64 with a seed (seed 0: XXH3_64bits), on the fastest kernel available. */
uint64_t md_h64(const void *p, size_t n, uint64_t seed);
void *md_h128_new(void);
void md_h128_free(void *s);
void md_h128_reset(void *s);
void md_h128_update(void *s, const void *p, size_t n);
void md_h128_digest(void *s, uint8_t out[16]);
void md_digest_final(md_digest *d, uint8_t out[16]);

/* ---- parallel for: calls fn(arg, i, worker) for i in [0, n) on up to `threads` threads;
 * worker < threads identifies the calling thread (for per-thread scratch). ---- */
typedef void (*md_task_fn)(void *arg, size_t i, uint32_t worker);
int md_parallel_for(uint32_t threads, size_t n, md_task_fn fn, void *arg);

/* ---- rolling weak sum: Adler-style pair over bytes + MD_ROLL_OFFSET, mod 2^32 ---- */
/* Sums of a whole block: s1 = sum x_i, s2 = sum (n - i) x_i with x_i = p[i] + MD_ROLL_OFFSET.
 * Vectorized where the CPU allows (md_common.c); identical results everywhere. */
void md_weak_block(const uint8_t *p, size_t n, uint32_t *s1_out, uint32_t *s2_out);
static inline uint64_t md_weak_key(uint32_t s1, uint32_t s2) {
    return ((uint64_t)s2 << 32) | s1;
}
/* The first filter's hash, tested at every byte: 32-bit lanes so that eight
 * positions can be hashed and looked up at once (md_delta.c); bit = hash >> shift. */
static inline uint32_t md_filter1(uint32_t s1, uint32_t s2) {
    return (s1 * 0x9E3779B1u) ^ (s2 * 0x85EBCA77u);
}
/* Nonzero when the CPU runs AVX2 (checked once) and the calling operation did not
 * ask for the portable code (MD_PORTABLE, a per-thread switch that each API entry
 * point sets and md_parallel_for hands to its workers). */
int md_cpu_avx2(void);
/* Nonzero when the CPU runs AVX-512 F/BW/VL and the switch is 0 or 3 (the switch's
 * level 2, for the tests only, stops at AVX2: every kernel level writes the same
 * bytes, and the tests compare them). */
int md_cpu_avx512(void);
/* Nonzero when md_cpu_avx512() is and the CPU also runs AVX-512 VBMI (byte
 * permutes across two registers) and the switch is 0 (its level 3, for the tests
 * only, stops at AVX-512 without VBMI). */
int md_cpu_avx512vbmi(void);
void md_set_portable(int portable);
int md_get_portable(void);
/* The API's common argument checks: threads (0..4) and flags; sets the switch above. */
md_status md_begin(const md_options *opt, uint32_t *threads, md_error *err);
/* Nonzero once the caller has asked the operation to stop (md_options.cancel). */
static inline int md_cancelled(const md_options *opt) {
    return opt && opt->cancel && __atomic_load_n(opt->cancel, __ATOMIC_RELAXED) != 0;
}
static inline uint64_t md_weak_mix(uint64_t k) {
    k ^= k >> 29;
    k *= 0x9E3779B97F4A7C15ull;
    return k ^ (k >> 32);
}

/* ---- signature in memory ---- */
struct md_sig {
    uint32_t block_len;
    uint32_t strong_len;
    uint64_t file_len;
    uint64_t block_count;
    uint8_t digest[16];
    uint32_t *s1;       /* per block */
    uint32_t *s2;
    uint8_t *strong;    /* block_count * strong_len */
    /* search structures (built by md_sig_index) */
    uint64_t *sorted_key;  /* distinct (weak, strong) entries sorted by weak key */
    uint32_t *sorted_idx;
    uint64_t n_sorted;
    uint32_t *slots;    /* open addressing over sorted: index of the first entry of a weak key */
    uint64_t slot_mask;
    uint32_t *bitmap;
    unsigned bitmap_shift; /* bit index = md_filter1(s1, s2) >> bitmap_shift */
    /* Two filters in front of the table: a small one that stays in L2 (tested at
     * every byte) and a larger one with an independent hash (tested on its hits). */
    uint64_t *filter2;
    unsigned filter2_shift; /* bit index = (key * MD_FILTER2_MUL) >> filter2_shift */
};
md_status md_sig_index(md_sig *sig, md_error *err);
uint32_t md_strong_len_for(uint64_t file_len, uint32_t block_len);
void md_strong(const uint8_t *p, size_t n, uint32_t strong_len, uint8_t *out);

/* ---- varints ---- */
static inline size_t md_put_varint(uint8_t *p, uint64_t v) {
    size_t i = 0;
    while (v >= 0x80) {
        p[i++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    p[i++] = (uint8_t)v;
    return i;
}
/* Returns bytes consumed, 0 on overflow or running off the end. */
static inline size_t md_get_varint(const uint8_t *p, size_t avail, uint64_t *out) {
    uint64_t v = 0;
    for (size_t i = 0; i < avail && i < 10; i++) {
        uint64_t b = p[i];
        if (i == 9 && b > 1) return 0;
        v |= (b & 0x7f) << (7 * i);
        if (!(b & 0x80)) {
            *out = v;
            return i + 1;
        }
    }
    return 0;
}
static inline uint64_t md_zigzag(int64_t v) { return ((uint64_t)v << 1) ^ (uint64_t)(v >> 63); }
static inline int64_t md_unzigzag(uint64_t v) { return (int64_t)(v >> 1) ^ -(int64_t)(v & 1); }

/* ---- the basis check of a v2 frame (FORMAT.md): the OLD ranges a frame reads, cut
 * at multiples of the block length, each piece hashed (the first strong_len bytes of
 * its XXH3-128), the piece hashes chained into one XXH3-64 that starts from the
 * frame's sequence number ---- */
typedef struct md_piece_hasher {
    uint32_t block_len, strong_len;
    uint64_t chain;
    uint64_t cut, end; /* inside the current range: end of the piece, end of the range */
    uint64_t pos;
    void *st;
} md_piece_hasher;
int md_ph_init(md_piece_hasher *h, uint32_t block_len, uint32_t strong_len);
void md_ph_free(md_piece_hasher *h);
void md_ph_frame(md_piece_hasher *h, uint64_t seq);               /* starts a frame's chain */
void md_ph_range(md_piece_hasher *h, uint64_t off, uint64_t len); /* starts an OLD range */
void md_ph_feed(md_piece_hasher *h, const uint8_t *p, size_t len); /* its bytes, in order */
uint64_t md_ph_chain(uint64_t chain, const uint8_t *piece_hash, uint32_t strong_len);

/* ---- numeric frames (md_numeric.c) ---- */
/* planes = zigzag(NEW - OLD) per little-endian element of `width` bytes (1, 2, 4, 8),
 * split into byte planes: plane b holds byte b of every element, planes in order. */
void md_num_encode(const uint8_t *old, const uint8_t *nw, size_t len, unsigned width, uint8_t *planes);
/* out = OLD + unzigzag(planes): the inverse of md_num_encode. */
void md_num_decode(const uint8_t *old, const uint8_t *planes, size_t len, unsigned width, uint8_t *out);

/* ---- order-0 rANS for numeric planes (md_rans.c) ---- */
#define MD_PLANE_RAW 0u
#define MD_PLANE_ZSTD 1u
#define MD_PLANE_RANS 2u
size_t md_rans_bound(size_t n); /* the dst capacity md_rans_encode needs */
/* Codes src (whose byte counts are `count`); returns the coded size, or 0 if it does
 * not fit (the caller codes the plane otherwise). */
size_t md_rans_encode(const uint8_t *src, size_t n, const uint32_t count[256], uint8_t *dst, size_t cap);
/* Decodes exactly n bytes from all len bytes of src; -1 on any malformed input. */
int md_rans_decode(const uint8_t *src, size_t len, uint8_t *dst, size_t n);
/* Byte counts of n symbols scaled to frequencies summing to 4096, each present symbol >= 1. */
void md_rans_normalize(const uint32_t count[256], size_t n, uint32_t freq[256]);

/* ---- rANS with 16-bit words and 32 or 64 states (md_rans16.c): plane codec 3 (32
 * states, engine 2.1-2.2) and 4 (64 states, what the encoder writes for planes of
 * MD_RANS64_MIN symbols or more since engine 2.3). `lanes` is 32 or 64; anything
 * else fails (encode 0, decode -1). ---- */
#define MD_PLANE_RANS16 3u
#define MD_PLANE_RANS64 4u
#ifndef MD_RANS64_MIN /* the fuzz builds lower it, so that their small inputs reach codec 4 */
#define MD_RANS64_MIN 16384u
#endif
/* Codes src into dst (cap bytes); returns the coded size, or 0 when it does not fit
 * in cap (pass the raw size: a plane coded larger than raw is stored raw anyway). */
size_t md_rans16_encode(const uint8_t *src, size_t n, const uint32_t count[256], uint8_t *dst, size_t cap,
                        unsigned lanes);
/* Two planes of n symbols each at once, each into cap bytes at its dst (the same
 * bytes as md_rans16_encode of each, faster); each length 0 when that one does not fit. */
void md_rans16_encode2(const uint8_t *src_a, const uint32_t count_a[256], uint8_t *dst_a, size_t *len_a,
                       const uint8_t *src_b, const uint32_t count_b[256], uint8_t *dst_b, size_t *len_b, size_t n,
                       size_t cap, unsigned lanes);
/* Decodes exactly n bytes from all len bytes of src; -1 on any malformed input. */
int md_rans16_decode(const uint8_t *src, size_t len, uint8_t *dst, size_t n, unsigned lanes);
/* Two planes of n symbols each at once (their work overlaps: faster than one after
 * the other); 0 only when both decode. */
int md_rans16_decode2(const uint8_t *src_a, size_t len_a, uint8_t *dst_a, const uint8_t *src_b, size_t len_b,
                      uint8_t *dst_b, size_t n, unsigned lanes);

/* ---- safetensors (md_safetensors.c) ---- */
typedef struct md_tensor {
    const char *name; /* the key as written in the JSON header (escapes kept), not NUL-ended */
    uint32_t name_len;
    uint32_t width;   /* bytes per element; 0 for a dtype the numeric model does not know */
    uint64_t off, len; /* in the file */
} md_tensor;
typedef struct md_st {
    uint8_t *header;  /* the JSON bytes; md_tensor.name points into it */
    uint64_t data_start;
    md_tensor *t;     /* sorted by offset */
    size_t n;
} md_st;
/* Parses the safetensors header of a file of `file_len` bytes at fd. Returns 1 and fills
 * st when it is one (every check of FORMAT.md passed), 0 when it is not or the header is
 * malformed or hostile (nothing is kept), -1 when memory or reading fails. */
int md_st_parse(int fd, uint64_t file_len, md_st *st);
/* The same over a header already in memory (the 8-byte length and the JSON). */
int md_st_parse_mem(const uint8_t *p, size_t n, uint64_t file_len, md_st *st);
void md_st_free(md_st *st);

/* ---- v2 frames ---- */
#define MD_END_FRAME_LEN (MD_FRAME_HDR_LEN + MD_END_PAYLOAD_LEN + 8u)
/* Writes the header of a frame whose C + S body bytes are already at o + MD_FRAME_HDR_LEN,
 * and its closing checksum after them; returns the frame's length. */
size_t md_frame_seal(uint8_t *o, uint8_t type, uint8_t codec, uint8_t param, uint32_t cmd_len,
                     uint32_t lit_len, uint32_t stored, uint64_t seq, uint64_t check);
/* The END frame: NEW's length and digest. */
void md_end_frame(uint8_t out[MD_END_FRAME_LEN], uint64_t seq, uint64_t new_len, const uint8_t digest[16]);
/* The 64-byte v2 delta header. */
void md_delta_header(uint8_t hdr[MD_HEADER_LEN], uint64_t old_len, const uint8_t old_digest[16],
                     uint32_t block_len, uint32_t strong_len);

#endif
