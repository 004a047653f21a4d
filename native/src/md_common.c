/* Errors, buffered I/O, the tree digest and the parallel-for used by the engine. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <xxhash.h>

#include "md_internal.h"

md_status md_fail(md_error *err, md_status st, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->message, sizeof err->message, fmt, ap);
        va_end(ap);
        err->sys_errno = 0;
    }
    return st;
}

md_status md_fail_io(md_error *err, int sys_errno, const char *what) {
    if (err) {
        snprintf(err->message, sizeof err->message, "%s failed: %s", what, strerror(sys_errno));
        err->sys_errno = sys_errno;
    }
    return MD_E_IO;
}

int64_t md_read_full(int fd, void *buf, size_t len) {
    size_t got = 0;
    while (got < len) {
        ssize_t r = read(fd, (uint8_t *)buf + got, len - got);
        if (r < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (r == 0) break;
        got += (size_t)r;
    }
    return (int64_t)got;
}

int64_t md_pread_full(int fd, void *buf, size_t len, uint64_t off) {
    size_t got = 0;
    while (got < len) {
        ssize_t r = pread(fd, (uint8_t *)buf + got, len - got, (off_t)(off + got));
        if (r < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (r == 0) break;
        got += (size_t)r;
    }
    return (int64_t)got;
}

int md_write_full(int fd, const void *buf, size_t len) {
    size_t done = 0;
    while (done < len) {
        ssize_t r = write(fd, (const uint8_t *)buf + done, len - done);
        if (r < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        done += (size_t)r;
    }
    return 0;
}

/* A fresh 4 KiB page costs a fault (trap, allocation, zeroing, accounting) the
 * first time it is written, and malloc hands a large buffer back to the system when
 * it is freed, so every call paid again for the pages of its buffers: ~20% of a
 * diff of a few MiB. Buffers that are written through in full get 2 MiB pages
 * instead (where the kernel allows them), one fault each. */
#define SCRATCH_ALIGN ((size_t)2 << 20)
static size_t scratch_len(size_t len) { return (len + SCRATCH_ALIGN - 1) & ~(SCRATCH_ALIGN - 1); }

void *md_scratch_alloc(size_t len) {
    size_t want = scratch_len(len ? len : 1);
    uint8_t *p = mmap(NULL, want + SCRATCH_ALIGN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    uintptr_t at = ((uintptr_t)p + SCRATCH_ALIGN - 1) & ~(uintptr_t)(SCRATCH_ALIGN - 1);
    size_t head = (size_t)(at - (uintptr_t)p);
    if (head) munmap(p, head);
    munmap((uint8_t *)at + want, SCRATCH_ALIGN - head);
#ifdef MADV_HUGEPAGE
    (void)madvise((void *)at, want, MADV_HUGEPAGE); /* advice only: 4 KiB pages still work */
#endif
    return (void *)at;
}

void md_scratch_free(void *p, size_t len) {
    if (p) munmap(p, scratch_len(len ? len : 1));
}

int md_writer_init(md_writer *w, int fd, size_t cap) {
    memset(w, 0, sizeof *w);
    w->fd = fd;
    w->len = 0;
    w->cap = cap;
    w->total = 0;
    w->failed_errno = 0;
    /* On its own pages (huge where the kernel allows): from malloc the buffer began
     * 16 bytes into a page, so every write's source sat 16 bytes off the page-cache
     * page it filled, and it lay on 4 KiB pages; which of the two mattered more was
     * not measured (mdtool patch, best of 9 and 7 rotating with dd: corpus 136 -> 129
     * ms, checkpoint 212 -> 203 ms). */
    w->buf = md_scratch_alloc(cap);
    return w->buf ? 0 : -1;
}

#define HOLE_GRAIN ((size_t)64 << 10)

static int all_zero(const uint8_t *p, size_t n) {
    if (!n || p[0]) return n == 0;
    return memcmp(p, p + 1, n - 1) == 0;
}

/* For a durable output, start the writeback of every full KICK_GRAIN as soon as it
 * is written, so that the disk works while we compute and the caller's final fsync
 * waits only for the tail. Failure here is harmless (the fsync still does all).
 * Every 1 MiB (one numeric frame), not 8: a checkpoint of 7-41 MB started no or few
 * writebacks at 8 MiB, and its fsync then waited ~3 ms for all of it. */
#define KICK_GRAIN ((uint64_t)1 << 20)
static void kick(md_writer *w) {
    uint64_t upto = w->emitted & ~(KICK_GRAIN - 1);
    if (!w->durable || upto <= w->kicked) return;
    (void)sync_file_range(w->fd, (off64_t)w->kicked, (off64_t)(upto - w->kicked), SYNC_FILE_RANGE_WRITE);
    w->kicked = upto;
}

/* A sparse output on ext4 has its blocks allocated (fallocate) just before the write
 * that fills them. Otherwise a buffered write into a fresh ext4 file reserves every
 * 4 KiB block for delayed allocation as it goes (the extent status tree, quota and
 * free-cluster counters: about a third of `dd`'s own system time), where a write into
 * allocated blocks only looks them up: 512 MiB in 1 MiB writes took 80 -> 50 ms, and
 * 206 -> 181 ms counting an fsync. Only the run about to be written is allocated
 * (KEEP_SIZE), so zero grains stay holes and nothing lies past the end (a failed
 * patch truncates its output to empty anyway). Any error (ENOSPC, say) turns it off
 * and leaves the verdict to the write. Only ext4, where it was measured: elsewhere
 * the trade is another one (btrfs copies on write; on NFS each call would be a round
 * trip to the server) and was not measured. */
int md_prealloc_pays(int fd) {
    struct statfs fs;
    return fstatfs(fd, &fs) == 0 && fs.f_type == EXT4_SUPER_MAGIC;
}

static void prealloc(md_writer *w, uint64_t at, size_t len) {
    if (w->prealloc && fallocate(w->fd, FALLOC_FL_KEEP_SIZE, (off_t)at, (off_t)len) != 0) w->prealloc = 0;
}

static int emit_raw(md_writer *w, const uint8_t *p, size_t len);
/* Writes out, turning whole all-zero grains into holes when the output is sparse. */
static int emit(md_writer *w, const uint8_t *p, size_t len) {
    int rc = emit_raw(w, p, len);
    if (rc == 0) {
        w->emitted += len;
        kick(w);
    }
    return rc;
}

/* The grains that are not all zeros go out in one write per run of them: a write per
 * 64 KiB grain made the kernel build the page cache in small folios, which cost
 * ~40% more system time than the same bytes written in 1 MiB calls. */
static int emit_raw(md_writer *w, const uint8_t *p, size_t len) {
    if (!w->sparse) return md_write_full(w->fd, p, len);
    uint64_t at = w->emitted; /* a sparse output is written from offset 0 */
    while (len) {
        size_t run = 0;
        while (run < len) {
            size_t take = len - run < HOLE_GRAIN ? len - run : HOLE_GRAIN;
            if (take == HOLE_GRAIN && all_zero(p + run, take)) break;
            run += take;
        }
        if (run) {
            prealloc(w, at, run);
            if (md_write_full(w->fd, p, run) != 0) return -1;
            w->ends_in_hole = 0;
            p += run;
            len -= run;
            at += run;
        }
        if (len) { /* a whole grain of zeros */
            if (lseek(w->fd, (off_t)HOLE_GRAIN, SEEK_CUR) < 0) return -1;
            w->ends_in_hole = 1;
            at += HOLE_GRAIN;
            p += HOLE_GRAIN;
            len -= HOLE_GRAIN;
        }
    }
    return 0;
}

int md_writer_flush(md_writer *w) {
    if (w->failed_errno) return -1;
    if (w->len && emit(w, w->buf, w->len) != 0) {
        w->failed_errno = errno;
        return -1;
    }
    w->len = 0;
    return 0;
}

int md_writer_finish(md_writer *w) {
    if (md_writer_flush(w) != 0) return -1;
    if (w->sparse && w->ends_in_hole) {
        off_t end = lseek(w->fd, 0, SEEK_CUR);
        if (end < 0 || ftruncate(w->fd, end) != 0) {
            w->failed_errno = errno;
            return -1;
        }
    }
    return 0;
}

/* Every write starts at a multiple of the buffer's size and all but the last are
 * whole buffers: a piece tops the buffer up, whole buffers of it go straight to the
 * file once the buffer is empty, the rest waits in the buffer. A large piece used to
 * go straight out wherever it fell, after a flush of the partial buffer; on a patch
 * whose copies and literals do not fall on 4 KiB boundaries (an insertion shifts
 * everything after it), every later write then straddled pages and folios: system
 * time of a patch of the benchmark's 1 GiB checkpoint 262 -> 225 ms, of its 512 MiB
 * corpus 133 -> 100 ms (best of 10, `dd bs=1M` of NEW 201 and 101 ms). Topping up
 * costs one memcpy of less than a buffer. */
int md_writer_put(md_writer *w, const void *data, size_t len) {
    const uint8_t *p = data;
    if (w->failed_errno) return -1;
    w->total += len;
    while (len) {
        if (w->len == 0 && len >= w->cap) {
            size_t whole = len - len % w->cap;
            if (emit(w, p, whole) != 0) {
                w->failed_errno = errno;
                return -1;
            }
            p += whole;
            len -= whole;
            continue;
        }
        size_t take = len < w->cap - w->len ? len : w->cap - w->len;
        memcpy(w->buf + w->len, p, take);
        w->len += take;
        p += take;
        len -= take;
        if (w->len == w->cap && md_writer_flush(w) != 0) return -1;
    }
    return 0;
}

void md_writer_free(md_writer *w) {
    md_scratch_free(w->buf, w->cap);
    w->buf = NULL;
}

/* ---- XXH3-128 dispatch ---- */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define MD_HAVE_AVX2_PATH 1
void md_avx2_h128(const void *p, size_t n, uint8_t out[16]);
void md_avx2_state_reset(void *s);
void md_avx2_state_update(void *s, const void *p, size_t n);
void md_avx2_state_digest(void *s, uint8_t out[16]);
uint64_t md_avx2_h64(const void *p, size_t n, uint64_t seed);
void md_avx512_h128(const void *p, size_t n, uint8_t out[16]);
void md_avx512_state_reset(void *s);
void md_avx512_state_update(void *s, const void *p, size_t n);
void md_avx512_state_digest(void *s, uint8_t out[16]);
uint64_t md_avx512_h64(const void *p, size_t n, uint64_t seed);
static int have_avx2(void);
#else
#define MD_HAVE_AVX2_PATH 0
static int have_avx2(void) { return 0; }
#endif

/* Which XXH3 kernel this thread hashes with: AVX-512 where md_cpu_avx512() allows it,
 * else AVX2, else the shared library (all give the same hashes, so the portable-code
 * levels of the tests check that). */
enum { HK_LIB, HK_AVX2, HK_AVX512 };
static int hash_kernel(void) {
#if MD_HAVE_AVX2_PATH
    if (md_cpu_avx512()) return HK_AVX512;
    if (have_avx2()) return HK_AVX2;
#endif
    return HK_LIB;
}

uint64_t md_h64(const void *p, size_t n, uint64_t seed) {
#if MD_HAVE_AVX2_PATH
    switch (hash_kernel()) {
    case HK_AVX512: return md_avx512_h64(p, n, seed);
    case HK_AVX2: return md_avx2_h64(p, n, seed);
    }
#endif
    return XXH3_64bits_withSeed(p, n, seed);
}
void md_h128(const void *p, size_t n, uint8_t out[16]) {
#if MD_HAVE_AVX2_PATH
    switch (hash_kernel()) {
    case HK_AVX512: md_avx512_h128(p, n, out); return;
    case HK_AVX2: md_avx2_h128(p, n, out); return;
    }
#endif
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(p, n));
    memcpy(out, c.digest, 16);
}
/* Every kernel's state is libxxhash's XXH3_state_t, allocated and freed the same way
 * (the kernels differ only in the code that updates it), so a state may outlive a
 * change of kernel. */
void *md_h128_new(void) { return XXH3_createState(); }
void md_h128_free(void *s) { XXH3_freeState((XXH3_state_t *)s); }
void md_h128_reset(void *s) {
#if MD_HAVE_AVX2_PATH
    switch (hash_kernel()) {
    case HK_AVX512: md_avx512_state_reset(s); return;
    case HK_AVX2: md_avx2_state_reset(s); return;
    }
#endif
    XXH3_128bits_reset((XXH3_state_t *)s);
}
void md_h128_update(void *s, const void *p, size_t n) {
#if MD_HAVE_AVX2_PATH
    switch (hash_kernel()) {
    case HK_AVX512: md_avx512_state_update(s, p, n); return;
    case HK_AVX2: md_avx2_state_update(s, p, n); return;
    }
#endif
    XXH3_128bits_update((XXH3_state_t *)s, p, n);
}
void md_h128_digest(void *s, uint8_t out[16]) {
#if MD_HAVE_AVX2_PATH
    switch (hash_kernel()) {
    case HK_AVX512: md_avx512_state_digest(s, out); return;
    case HK_AVX2: md_avx2_state_digest(s, out); return;
    }
#endif
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest((XXH3_state_t *)s));
    memcpy(out, c.digest, 16);
}

/* ---- digest ---- */
int md_digest_init(md_digest *d) {
    d->top = md_h128_new();
    d->chunk = md_h128_new();
    d->in_chunk = 0;
    d->total = 0;
    if (!d->top || !d->chunk) {
        md_digest_free(d);
        return -1;
    }
    md_h128_reset(d->top);
    md_h128_reset(d->chunk);
    return 0;
}

void md_digest_free(md_digest *d) {
    md_h128_free(d->top);
    md_h128_free(d->chunk);
    d->top = d->chunk = NULL;
}

void md_chunk_digest(const uint8_t *p, size_t len, uint8_t out[16]) { md_h128(p, len, out); }

void md_digest_add_chunk(md_digest *d, const uint8_t chunk_digest[16], uint64_t chunk_len) {
    md_h128_update(d->top, chunk_digest, 16);
    d->total += chunk_len;
}

static void close_chunk(md_digest *d) {
    uint8_t c[16];
    md_h128_digest(d->chunk, c);
    md_h128_update(d->top, c, 16);
    md_h128_reset(d->chunk);
    d->in_chunk = 0;
}

void md_digest_update(md_digest *d, const uint8_t *p, size_t len) {
    while (len) {
        uint64_t room = MD_CHUNK_LEN - d->in_chunk;
        size_t take = len < room ? len : (size_t)room;
        md_h128_update(d->chunk, p, take);
        d->in_chunk += take;
        d->total += take;
        p += take;
        len -= take;
        if (d->in_chunk == MD_CHUNK_LEN) close_chunk(d);
    }
}

void md_digest_final(md_digest *d, uint8_t out[16]) {
    uint8_t lenbuf[8];
    if (d->in_chunk) close_chunk(d);
    md_put_u64(lenbuf, d->total);
    md_h128_update(d->top, lenbuf, 8);
    md_h128_digest(d->top, out);
}

/* ---- the portable-code switch and the API's common checks ---- */
static _Thread_local int tls_portable;
void md_set_portable(int portable) { tls_portable = portable; }
int md_get_portable(void) { return tls_portable; }

md_status md_begin(const md_options *opt, uint32_t *threads, md_error *err) {
    uint32_t t = opt && opt->threads ? opt->threads : 1;
    /* Refused, not silently capped: a caller asking for 8 would otherwise believe it
     * got 8 (the rounds hold at most MD_MAX_WORKERS chunks, the memory bound). */
    if (t > MD_MAX_WORKERS)
        return md_fail(err, MD_E_INVALID, "threads must be between 1 and %u (the engine uses at most %u), not %u.",
                       MD_MAX_WORKERS, MD_MAX_WORKERS, t);
    if (opt && (opt->flags & ~(MD_DURABLE | MD_PORTABLE)))
        return md_fail(err, MD_E_INVALID, "unknown flags 0x%x.", opt->flags);
    md_set_portable(opt && (opt->flags & MD_PORTABLE));
    *threads = t;
    return MD_OK;
}

/* ---- basis check of v2 frames ---- */
int md_ph_init(md_piece_hasher *h, uint32_t block_len, uint32_t strong_len) {
    memset(h, 0, sizeof *h);
    h->block_len = block_len ? block_len : 1;
    h->strong_len = strong_len;
    h->st = md_h128_new();
    return h->st ? 0 : -1;
}
void md_ph_free(md_piece_hasher *h) {
    md_h128_free(h->st);
    h->st = NULL;
}
void md_ph_frame(md_piece_hasher *h, uint64_t seq) {
    h->chain = seq;
    h->pos = h->cut = h->end = 0;
}
uint64_t md_ph_chain(uint64_t chain, const uint8_t *piece_hash, uint32_t strong_len) {
    return XXH3_64bits_withSeed(piece_hash, strong_len, chain);
}
static void ph_next_cut(md_piece_hasher *h) {
    uint64_t grid = (h->pos / h->block_len + 1) * h->block_len;
    h->cut = grid < h->end ? grid : h->end;
    md_h128_reset(h->st);
}
void md_ph_range(md_piece_hasher *h, uint64_t off, uint64_t len) {
    h->pos = off;
    h->end = off + len;
    ph_next_cut(h);
}
void md_ph_feed(md_piece_hasher *h, const uint8_t *p, size_t len) {
    while (len && h->pos < h->end) {
        uint64_t room = h->cut - h->pos;
        size_t take = len < room ? len : (size_t)room;
        md_h128_update(h->st, p, take);
        h->pos += take;
        p += take;
        len -= take;
        if (h->pos == h->cut) {
            uint8_t d[16];
            md_h128_digest(h->st, d);
            h->chain = md_ph_chain(h->chain, d, h->strong_len);
            if (h->pos < h->end) ph_next_cut(h);
        }
    }
}

/* ---- parallel for ---- */
typedef struct pf_shared {
    md_task_fn fn;
    int portable;
    uint32_t next_worker;
    void *arg;
    size_t n;
    size_t next; /* guarded by the atomic builtins */
} pf_shared;

static void *pf_worker(void *p) {
    pf_shared *s = p;
    md_set_portable(s->portable);
    uint32_t worker = __atomic_fetch_add(&s->next_worker, 1, __ATOMIC_RELAXED);
    for (;;) {
        size_t i = __atomic_fetch_add(&s->next, 1, __ATOMIC_RELAXED);
        if (i >= s->n) break;
        s->fn(s->arg, i, worker);
    }
    return NULL;
}

int md_parallel_for(uint32_t threads, size_t n, md_task_fn fn, void *arg) {
    pf_shared s = {fn, md_get_portable(), 0, arg, n, 0};
    pthread_t tids[MD_MAX_THREADS];
    uint32_t started = 0;
    if (threads > MD_MAX_THREADS) threads = MD_MAX_THREADS;
    if (threads > n) threads = (uint32_t)n;
    /* The calling thread works too, so `threads` workers need threads - 1 extra. */
    for (uint32_t t = 1; t < threads; t++) {
        if (pthread_create(&tids[started], NULL, pf_worker, &s) != 0) break;
        started++;
    }
    pf_worker(&s);
    for (uint32_t t = 0; t < started; t++) pthread_join(tids[t], NULL);
    return 0;
}

/* ---- weak sums of a block ---- */
/* Over a prefix of m bytes keep S1 = sum x_i and W = sum (m - i) x_i. Appending one
 * byte gives S1 += x, W += S1; appending 32 bytes gives W += 32 * S1_before +
 * sum (32 - j) x_j, which is what the AVX2 path computes. All mod 2^32. */
static void weak_scalar(const uint8_t *p, size_t n, uint32_t *s1, uint32_t *w) {
    uint32_t a = *s1, b = *w;
    for (size_t i = 0; i < n; i++) {
        a += p[i];
        b += a;
    }
    *s1 = a;
    *w = b;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
__attribute__((target("avx2"))) static size_t weak_avx2(const uint8_t *p, size_t n, uint32_t *s1,
                                                        uint32_t *w) {
    const __m256i weights = _mm256_setr_epi8(32, 31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19,
                                             18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3,
                                             2, 1);
    const __m256i ones = _mm256_set1_epi16(1), zero = _mm256_setzero_si256();
    __m256i vs1 = zero, vps = zero, vs2 = zero;
    size_t blocks = n / 32;
    for (size_t i = 0; i < blocks; i++) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(p + 32 * i));
        vps = _mm256_add_epi32(vps, vs1);
        vs1 = _mm256_add_epi32(vs1, _mm256_sad_epu8(v, zero));
        vs2 = _mm256_add_epi32(vs2, _mm256_madd_epi16(_mm256_maddubs_epi16(v, weights), ones));
    }
    uint32_t l1[8], lp[8], l2[8];
    _mm256_storeu_si256((__m256i *)l1, vs1);
    _mm256_storeu_si256((__m256i *)lp, vps);
    _mm256_storeu_si256((__m256i *)l2, vs2);
    uint32_t a = 0, ps = 0, b = 0;
    for (int i = 0; i < 8; i++) {
        a += l1[i];
        ps += lp[i];
        b += l2[i];
    }
    /* prefix before this call contributes S1_before * (32 * blocks) to W */
    *w += *s1 * (uint32_t)(32 * blocks) + 32u * ps + b;
    *s1 += a;
    return blocks * 32;
}
static int have_avx2(void) {
    static int cached = -1; /* what the CPU can do: the same for every caller */
    int c = __atomic_load_n(&cached, __ATOMIC_RELAXED);
    if (c < 0) {
        __builtin_cpu_init();
        c = __builtin_cpu_supports("avx2") ? 1 : 0;
        __atomic_store_n(&cached, c, __ATOMIC_RELAXED);
    }
    /* MD_PORTABLE forces the portable code, so that the tests can check that both
     * paths write the same bytes. */
    return c && tls_portable != 1;
}
#endif

int md_cpu_avx2(void) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    return have_avx2();
#else
    return 0;
#endif
}

int md_cpu_avx512(void) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    static int cached = -1;
    int c = __atomic_load_n(&cached, __ATOMIC_RELAXED);
    if (c < 0) {
        __builtin_cpu_init();
        c = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                    __builtin_cpu_supports("avx512vl")
                ? 1
                : 0;
        __atomic_store_n(&cached, c, __ATOMIC_RELAXED);
    }
    /* level 2 of the switch (tests only) stops at AVX2 and level 3 at AVX-512 without
     * VBMI, so that the tests can check that every kernel writes the same bytes */
    return c && (tls_portable == 0 || tls_portable == 3);
#else
    return 0;
#endif
}

int md_cpu_avx512vbmi(void) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    static int cached = -1;
    int c = __atomic_load_n(&cached, __ATOMIC_RELAXED);
    if (c < 0) {
        __builtin_cpu_init();
        c = __builtin_cpu_supports("avx512vbmi") ? 1 : 0;
        __atomic_store_n(&cached, c, __ATOMIC_RELAXED);
    }
    return c && md_cpu_avx512() && tls_portable == 0;
#else
    return 0;
#endif
}

void md_weak_block(const uint8_t *p, size_t n, uint32_t *s1_out, uint32_t *s2_out) {
    uint32_t s1 = 0, w = 0;
    size_t done = 0;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (have_avx2()) done = weak_avx2(p, n, &s1, &w);
#endif
    weak_scalar(p + done, n - done, &s1, &w);
    uint32_t nn = (uint32_t)n;
    *s1_out = s1 + nn * MD_ROLL_OFFSET;
    *s2_out = w + MD_ROLL_OFFSET * (uint32_t)(((uint64_t)nn * (nn + 1u)) / 2u);
}

/* ---- v2 frames ---- */
size_t md_frame_seal(uint8_t *o, uint8_t type, uint8_t codec, uint8_t param, uint32_t cmd_len,
                     uint32_t lit_len, uint32_t stored, uint64_t seq, uint64_t check) {
    o[0] = type;
    o[1] = codec;
    o[2] = param;
    o[3] = 0;
    md_put_u32(o + 4, cmd_len);
    md_put_u32(o + 8, lit_len);
    md_put_u32(o + 12, stored);
    md_put_u64(o + 16, seq);
    md_put_u64(o + 24, check);
    md_put_u64(o + 32, XXH3_64bits(o, 32));
    size_t body = MD_FRAME_HDR_LEN + (size_t)cmd_len + stored;
    md_put_u64(o + body, md_h64(o, body, 0)); /* = XXH3_64bits, on the fast kernel */
    return body + 8;
}

void md_end_frame(uint8_t out[MD_END_FRAME_LEN], uint64_t seq, uint64_t new_len, const uint8_t digest[16]) {
    memset(out, 0, MD_END_FRAME_LEN);
    md_put_u64(out + MD_FRAME_HDR_LEN, new_len);
    memcpy(out + MD_FRAME_HDR_LEN + 8, digest, 16);
    md_frame_seal(out, MD_FRAME_END, 0, 0, MD_END_PAYLOAD_LEN, 0, 0, seq, 0);
}

void md_delta_header(uint8_t hdr[MD_HEADER_LEN], uint64_t old_len, const uint8_t old_digest[16],
                     uint32_t block_len, uint32_t strong_len) {
    memset(hdr, 0, MD_HEADER_LEN);
    memcpy(hdr, MD_DELTA_MAGIC, 8);
    md_put_u32(hdr + 8, MD_VERSION);
    md_put_u64(hdr + 16, old_len);
    if (old_digest) memcpy(hdr + 24, old_digest, 16);
    md_put_u32(hdr + 40, block_len);
    md_put_u32(hdr + 44, strong_len);
    md_put_u64(hdr + 56, XXH3_64bits(hdr, 56));
}
