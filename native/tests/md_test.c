/* C tests of the delta engine: round trips over edge cases, thread-count
 * invariance, and rejection of every single-byte corruption and every
 * truncation of small deltas and signatures. Run plain and under ASan+UBSan.
 *   md_test                       run the tests (each section prints its time)
 *   md_test --part K/N            run every N-th section from the K-th (N processes
 *                                 at once cover every test once)
 *   md_test --write-seeds SIG DLT [ST] write fuzz seed corpora into the folders */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <linux/fiemap.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <xxhash.h>

#include "../src/md_internal.h"

static int failures = 0;
#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        if (!(cond)) {                                                          \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                \
            fprintf(stderr, __VA_ARGS__);                                       \
            fprintf(stderr, "\n");                                              \
            failures++;                                                         \
        }                                                                       \
    } while (0)

typedef struct buf {
    uint8_t *p;
    size_t n;
} buf;

static int mem_fd(const buf *b) {
    int fd = memfd_create("md", 0);
    if (fd < 0) abort();
    if (b && b->n && write(fd, b->p, b->n) != (ssize_t)b->n) abort();
    lseek(fd, 0, SEEK_SET);
    return fd;
}

static buf fd_contents(int fd) {
    buf b = {0};
    off_t end = lseek(fd, 0, SEEK_END);
    b.n = (size_t)end;
    b.p = malloc(b.n ? b.n : 1);
    if (b.n && pread(fd, b.p, b.n, 0) != (ssize_t)b.n) abort();
    return b;
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static buf random_buf(size_t n) {
    buf b = {malloc(n ? n : 1), n};
    for (size_t i = 0; i < n; i++) b.p[i] = (uint8_t)rnd();
    return b;
}

static md_status make_sig(const buf *old, uint32_t threads, uint32_t block, buf *sig) {
    md_options o = {.threads = threads, .block_len = block, .flags = 0};
    md_error e;
    int a = mem_fd(old), s = mem_fd(NULL);
    md_status rc = md_signature(a, s, &o, NULL, &e);
    *sig = fd_contents(s);
    close(a);
    close(s);
    return rc;
}

static md_status make_delta(const buf *sig, const buf *nw, uint32_t threads, buf *delta, md_error *e) {
    md_options o = {.threads = threads, .block_len = 0, .flags = 0};
    int s = mem_fd(sig), n = mem_fd(nw), d = mem_fd(NULL);
    md_status rc = md_delta(s, n, d, &o, NULL, e);
    *delta = fd_contents(d);
    close(s);
    close(n);
    close(d);
    return rc;
}

static md_status apply(const buf *old, const buf *delta, buf *out, md_error *e) {
    md_options o = {.threads = 2, .block_len = 0, .flags = 0};
    int a = mem_fd(old), d = mem_fd(delta), w = mem_fd(NULL);
    md_status rc = md_patch(a, d, w, &o, NULL, e);
    *out = fd_contents(w);
    close(a);
    close(d);
    close(w);
    return rc;
}

static void round_trip(const char *name, const buf *old, const buf *nw, uint32_t block, size_t max_delta) {
    buf sig1, sig3, d1, d3, out;
    md_error e;
    CHECK(make_sig(old, 1, block, &sig1) == MD_OK, "%s: signature", name);
    CHECK(make_sig(old, 3, block, &sig3) == MD_OK, "%s: signature 3 threads", name);
    CHECK(sig1.n == sig3.n && memcmp(sig1.p, sig3.p, sig1.n) == 0, "%s: signature differs by threads", name);
    CHECK(make_delta(&sig1, nw, 1, &d1, &e) == MD_OK, "%s: delta: %s", name, e.message);
    CHECK(make_delta(&sig1, nw, 3, &d3, &e) == MD_OK, "%s: delta 3: %s", name, e.message);
    CHECK(d1.n == d3.n && memcmp(d1.p, d3.p, d1.n) == 0, "%s: delta differs by threads", name);
    CHECK(apply(old, &d1, &out, &e) == MD_OK, "%s: patch: %s", name, e.message);
    CHECK(out.n == nw->n && (out.n == 0 || memcmp(out.p, nw->p, out.n) == 0), "%s: round trip", name);
    if (max_delta) CHECK(d1.n <= max_delta, "%s: delta %zu > %zu bytes", name, d1.n, max_delta);
    free(sig1.p);
    free(sig3.p);
    free(d1.p);
    free(d3.p);
    free(out.p);
}

static void edge_cases(void) {
    buf empty = {malloc(1), 0};
    buf one = random_buf(1);
    buf r = random_buf(3 << 20);
    buf zeros = {calloc(1, 1 << 20), 1 << 20};
    round_trip("empty/empty", &empty, &empty, 0, 256);
    round_trip("empty/one", &empty, &one, 0, 512);
    round_trip("one/empty", &one, &empty, 0, 512);
    round_trip("one/one", &one, &one, 0, 512);
    buf small = {r.p, 300};
    round_trip("small identical", &small, &small, 1024, 512);
    buf exact = {r.p, 4096};
    round_trip("exact multiple", &exact, &exact, 1024, 512);
    round_trip("identical", &r, &r, 0, 1024);
    round_trip("identical 4k blocks", &r, &r, 4096, 1024);
    round_trip("zeros", &zeros, &zeros, 0, 1024);
    buf other = random_buf(1 << 20);
    round_trip("unrelated", &r, &other, 0, 0);
    /* an insertion, a deletion and an overwrite */
    buf ed = {malloc(r.n + 100), 0};
    memcpy(ed.p, r.p, 5000);
    memcpy(ed.p + 5000, "inserted!", 9);
    memcpy(ed.p + 5009, r.p + 5000, 1000000);
    memcpy(ed.p + 1005009, r.p + 1100000, r.n - 1100000);
    ed.n = 1005009 + r.n - 1100000;
    memset(ed.p + 2000000, 7, 1000);
    round_trip("edits", &r, &ed, 0, 40000);
    /* 5 MiB of zeros: spans segments of the delta */
    buf bigz = {calloc(1, 5 << 20), 5 << 20};
    round_trip("zeros over segments", &bigz, &bigz, 0, 1024);
    free(bigz.p);
    free(ed.p);
    free(other.p);
    free(empty.p);
    free(one.p);
    free(r.p);
    free(zeros.p);
}

/* Every position near either end, a prime stride in between (keeps ASan runs short). */
static size_t sample_next(size_t i, size_t n) {
    if (i < 160 || i + 160 >= n) return i + 1;
    return i + 31 < n - 160 ? i + 31 : n - 160;
}

/* The same, with at most about 256 positions between the ends: the 16-bit rANS damage
 * sweep decodes a whole plane at every kernel level per position, and at a stride of
 * 31 the 200,003-byte planes made it most of the sanitized run's time. A plane's header
 * and state words are at its ends, which stay swept byte by byte; the fuzz harnesses
 * damage the middle too. */
static size_t sample_next_sparse(size_t i, size_t n) {
    if (i < 160 || i + 160 >= n) return i + 1;
    size_t stride = (n - 320) / 256 > 31 ? (n - 320) / 256 : 31;
    return i + stride < n - 160 ? i + stride : n - 160;
}

static void corruption(void) {
    buf old = random_buf(20000), nw = random_buf(30000), sig, delta, out;
    memcpy(nw.p + 5000, old.p, 15000);
    md_error e;
    make_sig(&old, 1, 1024, &sig);
    make_delta(&sig, &nw, 1, &delta, &e);
    CHECK(apply(&old, &delta, &out, &e) == MD_OK, "clean patch: %s", e.message);
    free(out.p);
    /* single-byte changes of the delta are rejected: every byte of the header
     * and of the last frames, a stride through the rest */
    for (size_t i = 0; i < delta.n; i = sample_next(i, delta.n)) {
        delta.p[i] ^= 0x5a;
        md_status rc = apply(&old, &delta, &out, &e);
        CHECK(rc == MD_E_CORRUPT_DELTA, "corrupt byte %zu gave %d", i, rc);
        CHECK(out.n == 0, "corrupt byte %zu left %zu output bytes", i, out.n);
        delta.p[i] ^= 0x5a;
        free(out.p);
    }
    /* truncations are rejected as truncated */
    for (size_t n = 0; n < delta.n; n = sample_next(n, delta.n)) {
        buf t = {delta.p, n};
        md_status rc = apply(&old, &t, &out, &e);
        CHECK(rc == MD_E_TRUNCATED_DELTA, "truncation at %zu gave %d", n, rc);
        free(out.p);
    }
    /* the wrong basis is refused */
    old.p[100] ^= 1;
    CHECK(apply(&old, &delta, &out, &e) == MD_E_WRONG_BASIS, "wrong basis accepted");
    CHECK(out.n == 0, "the wrong basis left %zu output bytes", out.n);
    free(out.p);
    /* into a pipe (no way to take bytes back) the digest is checked before writing */
    {
        int pfd[2];
        CHECK(pipe(pfd) == 0, "pipe");
        int a = mem_fd(&old), d = mem_fd(&delta);
        md_options o = {.threads = 1, .block_len = 0, .flags = 0};
        CHECK(md_patch(a, d, pfd[1], &o, NULL, &e) == MD_E_WRONG_BASIS, "wrong basis into a pipe");
        close(pfd[1]);
        char probe;
        CHECK(read(pfd[0], &probe, 1) == 0, "the wrong basis wrote into a pipe");
        close(pfd[0]);
        close(a);
        close(d);
    }
    /* a damaged delta on the wrong basis is still the wrong basis, and leaves nothing */
    delta.p[delta.n - 1] ^= 0x5a;
    CHECK(apply(&old, &delta, &out, &e) == MD_E_WRONG_BASIS, "wrong basis + corrupt delta");
    CHECK(out.n == 0, "wrong basis + corrupt delta left %zu output bytes", out.n);
    delta.p[delta.n - 1] ^= 0x5a;
    free(out.p);
    buf shorter = {old.p, old.n - 1};
    CHECK(apply(&shorter, &delta, &out, &e) == MD_E_WRONG_BASIS, "short basis accepted");
    free(out.p);
    old.p[100] ^= 1;
    /* and the right basis into a pipe gives NEW */
    {
        int pfd[2];
        CHECK(pipe(pfd) == 0, "pipe");
        int a = mem_fd(&old), d = mem_fd(&delta);
        md_options o = {.threads = 2, .block_len = 0, .flags = 0};
        CHECK(md_patch(a, d, pfd[1], &o, NULL, &e) == MD_OK, "patch into a pipe: %s", e.message);
        close(pfd[1]);
        buf got = {malloc(nw.n + 1), 0};
        ssize_t r;
        while ((r = read(pfd[0], got.p + got.n, nw.n + 1 - got.n)) > 0) got.n += (size_t)r;
        CHECK(got.n == nw.n && memcmp(got.p, nw.p, nw.n) == 0, "patch into a pipe: bytes differ");
        free(got.p);
        close(pfd[0]);
        close(a);
        close(d);
    }
    /* every single-byte change and truncation of the signature is rejected */
    for (size_t i = 0; i < sig.n; i = sample_next(i, sig.n)) {
        buf d2;
        sig.p[i] ^= 0x21;
        md_status rc = make_delta(&sig, &nw, 1, &d2, &e);
        CHECK(rc == MD_E_CORRUPT_SIGNATURE, "signature corruption at %zu gave %d", i, rc);
        sig.p[i] ^= 0x21;
        free(d2.p);
    }
    for (size_t n = 0; n < sig.n; n = sample_next(n, sig.n)) {
        buf d2, t = {sig.p, n};
        md_status rc = make_delta(&t, &nw, 1, &d2, &e);
        CHECK(rc == MD_E_CORRUPT_SIGNATURE, "signature truncation at %zu gave %d", n, rc);
        free(d2.p);
    }
    free(old.p);
    free(nw.p);
    free(sig.p);
    free(delta.p);
}

static void write_file(const char *dir, const char *name, const buf *b) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    fwrite(b->p, 1, b->n, f);
    fclose(f);
}

static md_status make_basis(const buf *old, const buf *nw, uint32_t threads, uint32_t width, buf *delta,
                            md_error *e) {
    md_options o = {.threads = threads, .elem_width = width};
    int a = mem_fd(old), n = mem_fd(nw), d = mem_fd(NULL);
    md_status rc = md_delta_basis(a, n, d, &o, NULL, e);
    *delta = fd_contents(d);
    close(a);
    close(n);
    close(d);
    return rc;
}

/* A safetensors file of float32 tensors named t0, t1, ... of the given element counts. */
static buf safetensors(const size_t *counts, size_t n, const float *values) {
    char json[4096];
    size_t jl = 0, off = 0;
    jl += (size_t)snprintf(json + jl, sizeof json - jl, "{\"__metadata__\":{\"a\":\"b\"}");
    for (size_t i = 0; i < n; i++) {
        jl += (size_t)snprintf(json + jl, sizeof json - jl,
                               ",\"t%zu\":{\"dtype\":\"F32\",\"shape\":[%zu],\"data_offsets\":[%zu,%zu]}", i,
                               counts[i], off, off + counts[i] * 4);
        off += counts[i] * 4;
    }
    jl += (size_t)snprintf(json + jl, sizeof json - jl, "}");
    buf b = {malloc(8 + jl + off), 8 + jl + off};
    md_put_u64(b.p, jl);
    memcpy(b.p + 8, json, jl);
    memcpy(b.p + 8 + jl, values, off);
    return b;
}

static void check_patch(const char *name, const buf *old, const buf *delta, const buf *want) {
    buf out;
    md_error e;
    CHECK(apply(old, delta, &out, &e) == MD_OK, "%s: patch: %s", name, e.message);
    CHECK(out.n == want->n && (out.n == 0 || memcmp(out.p, want->p, out.n) == 0), "%s: round trip", name);
    free(out.p);
}

/* n weights in a and the same after a small optimizer step in b (numeric deltas' input). */
static void weights_step(float *a, float *b, size_t n) {
    for (size_t i = 0; i < n; i++) {
        a[i] = (float)((int64_t)(rnd() % 2001) - 1000) * 2e-5f;
        b[i] = a[i] + (float)((int64_t)(rnd() % 21) - 10) * 1e-7f;
    }
}

/* Numeric deltas: exact for every bit pattern, smaller than literals, thread-invariant,
 * and every single-byte corruption or truncation refused. */
static void numeric(void) {
    size_t n = 300000;
    float *a = malloc(n * 4 * 2), *b = a + n;
    weights_step(a, b, n);
    uint32_t special[] = {0x7fc00001u, 0xffc00000u, 0x7f800000u, 0xff800000u, 0x80000000u, 0x00000001u, 0x807fffffu};
    memcpy(a, special, sizeof special);
    memcpy(b + 100, special, sizeof special);
    buf old = {(uint8_t *)a, n * 4}, nw = {(uint8_t *)b, n * 4}, d1, d3;
    md_error e;
    for (uint32_t w = 1; w <= 8; w *= 2) {
        CHECK(make_basis(&old, &nw, 1, w, &d1, &e) == MD_OK, "basis width %u: %s", w, e.message);
        CHECK(make_basis(&old, &nw, 3, w, &d3, &e) == MD_OK, "basis width %u, 3 threads", w);
        CHECK(d1.n == d3.n && memcmp(d1.p, d3.p, d1.n) == 0, "basis width %u differs by threads", w);
        check_patch("basis", &old, &d1, &nw);
        if (w == 4) CHECK(d1.n < nw.n / 2, "fp32 numeric delta of %zu bytes", d1.n);
        free(d1.p);
        free(d3.p);
    }
    /* safetensors: tensors paired by name, one reordered, one resized, one gained */
    size_t c1[] = {100000, 50000, 1000}, c2[] = {100000, 50000, 1200, 7};
    buf so = safetensors(c1, 3, a), sn = safetensors(c2, 4, b);
    CHECK(make_basis(&so, &sn, 2, 0, &d1, &e) == MD_OK, "safetensors basis: %s", e.message);
    check_patch("safetensors", &so, &d1, &sn);
    CHECK(d1.n < sn.n / 2, "safetensors delta of %zu bytes", d1.n);
    /* corruption and truncation of a delta with numeric frames */
    buf out;
    for (size_t i = 0; i < d1.n; i = sample_next(i, d1.n) + (i > 200 && i + 400 < d1.n ? 997 : 0)) {
        d1.p[i] ^= 0x5a;
        md_status rc = apply(&so, &d1, &out, &e);
        CHECK(rc == MD_E_CORRUPT_DELTA, "numeric: corrupt byte %zu gave %d", i, rc);
        CHECK(out.n == 0, "numeric: corrupt byte %zu left %zu bytes", i, out.n);
        d1.p[i] ^= 0x5a;
        free(out.p);
    }
    for (size_t k = 0; k < d1.n; k = sample_next(k, d1.n) + (k > 200 && k + 400 < d1.n ? 997 : 0)) {
        buf t = {d1.p, k};
        md_status rc = apply(&so, &t, &out, &e);
        CHECK(rc == MD_E_TRUNCATED_DELTA, "numeric: truncation at %zu gave %d", k, rc);
        free(out.p);
    }
    /* the wrong basis in a range a numeric frame reads; the output cap */
    so.p[so.n - 5000] ^= 1;
    CHECK(apply(&so, &d1, &out, &e) == MD_E_WRONG_BASIS, "numeric: wrong basis accepted");
    CHECK(out.n == 0, "numeric: wrong basis left bytes");
    free(out.p);
    so.p[so.n - 5000] ^= 1;
    {
        md_options o = {.threads = 1, .max_output = sn.n - 1};
        int x = mem_fd(&so), y = mem_fd(&d1), z = mem_fd(NULL);
        CHECK(md_patch(x, y, z, &o, NULL, &e) == MD_E_LIMIT, "output cap not enforced");
        out = fd_contents(z);
        CHECK(out.n == 0, "the output cap left %zu bytes", out.n);
        free(out.p);
        close(x);
        close(y);
        close(z);
    }
    free(d1.p);
    free(so.p);
    free(sn.p);
    free(a);
}

/* A patch with threads >= 2 decodes numeric planes on a second thread while it writes
 * the frame before: the same output, status and message as one thread for every
 * corruption and truncation, and into an output that cannot be taken back the same
 * bytes before the failure (frames in order; the earlier frame's error first). */
static md_status apply_into(const buf *old, const buf *delta, uint32_t threads, uint64_t cap, int rewindable,
                            buf *out, md_error *e) {
    md_options o = {.threads = threads, .max_output = cap};
    int a = mem_fd(old), d = mem_fd(delta), w = mem_fd(NULL);
    if (!rewindable && write(w, "x", 1) != 1) abort(); /* not empty: no truncation on failure */
    md_status rc = md_patch(a, d, w, &o, NULL, e);
    *out = fd_contents(w);
    close(a);
    close(d);
    close(w);
    return rc;
}

static void same_as_one_thread(const char *what, size_t at, const buf *old, const buf *delta, uint64_t cap) {
    for (int rewindable = 0; rewindable <= 1; rewindable++) {
        buf o1, o2;
        md_error e1 = {0}, e2 = {0};
        md_status r1 = apply_into(old, delta, 1, cap, rewindable, &o1, &e1);
        md_status r2 = apply_into(old, delta, 2, cap, rewindable, &o2, &e2);
        CHECK(r1 == r2, "%s %zu: status %d with one thread, %d with two", what, at, r1, r2);
        CHECK(r1 == MD_OK || strcmp(e1.message, e2.message) == 0, "%s %zu: '%s' vs '%s'", what, at, e1.message,
              e2.message);
        CHECK(o1.n == o2.n && memcmp(o1.p, o2.p, o1.n) == 0, "%s %zu: %zu bytes out with one thread, %zu with two",
              what, at, o1.n, o2.n);
        free(o1.p);
        free(o2.p);
    }
}

static void patch_pipelined(void) {
    /* many small numeric frames (tensors under 1 MiB), one of them gained (no basis) */
    size_t n = 400000;
    float *a = malloc(n * 4 * 2), *b = a + n;
    weights_step(a, b, n);
    size_t c1[] = {90000, 60000, 1000, 80000, 30000}, c2[] = {90000, 60000, 1000, 80000, 30000, 20000};
    buf so = safetensors(c1, 5, a), sn = safetensors(c2, 6, b), d;
    md_error e;
    CHECK(make_basis(&so, &sn, 1, 0, &d, &e) == MD_OK, "pipelined: basis: %s", e.message);
    same_as_one_thread("pipelined: intact", 0, &so, &d, 0);
    check_patch("pipelined", &so, &d, &sn);
    for (size_t i = 0; i < d.n; i = sample_next(i, d.n) + (i > 200 && i + 400 < d.n ? 1999 : 0)) {
        d.p[i] ^= 0x21;
        same_as_one_thread("pipelined: corrupt byte", i, &so, &d, 0);
        d.p[i] ^= 0x21;
    }
    for (size_t k = 0; k < d.n; k = sample_next(k, d.n) + (k > 200 && k + 400 < d.n ? 1999 : 0)) {
        buf t = {d.p, k};
        same_as_one_thread("pipelined: truncated at", k, &so, &t, 0);
    }
    /* the wrong basis under each numeric frame; the output cap at several places */
    for (size_t at = so.n - 4; at > 400; at -= so.n / 7) {
        so.p[at] ^= 1;
        same_as_one_thread("pipelined: wrong basis at", at, &so, &d, 0);
        so.p[at] ^= 1;
    }
    for (uint64_t cap = 1; cap < sn.n; cap += sn.n / 5) same_as_one_thread("pipelined: cap", (size_t)cap, &so, &d, cap);
    free(d.p);
    free(so.p);
    free(sn.p);
    free(a);
}

/* A delta from a signature, threads >= 2: each DATA frame's zstd literals decode on
 * the second thread while the frame before it is written. Every outcome is one
 * thread's: damage in and around each frame's header and inside it, a cut at each
 * frame's edges and middle, the wrong basis under each frame, the output cap. */
static void patch_pipelined_data(void) {
    const size_t n = (size_t)3 << 20, step = 64 * 1024, copied = 16 * 1024;
    buf old = random_buf(n), nw = {malloc(n), n}, sig, d;
    md_error e;
    for (size_t at = 0; at < n; at += step) { /* 16 KiB of OLD from elsewhere, then 48 KiB of text */
        memcpy(nw.p + at, old.p + (n - at - step), copied);
        for (size_t i = at + copied; i < at + step; i++) nw.p[i] = (uint8_t)('a' + rnd() % 11);
    }
    CHECK(make_sig(&old, 1, 0, &sig) == MD_OK, "pipelined data: signature");
    CHECK(make_delta(&sig, &nw, 1, &d, &e) == MD_OK, "pipelined data: delta: %s", e.message);
    size_t starts[16], frames = 0, zstd_frames = 0;
    for (size_t pos = MD_HEADER_LEN; pos + MD_FRAME_HDR_LEN <= d.n && frames < 16;) {
        starts[frames++] = pos;
        zstd_frames += d.p[pos] == MD_FRAME_DATA && d.p[pos + 1] == MD_CODEC_ZSTD;
        pos += MD_FRAME_HDR_LEN + md_get_u32(d.p + pos + 4) + md_get_u32(d.p + pos + 12) + 8;
    }
    CHECK(zstd_frames >= 3, "pipelined data: %zu zstd DATA frames", zstd_frames);
    md_options o = {.threads = 2};
    md_stats st;
    int a = mem_fd(&old), df = mem_fd(&d), w = mem_fd(NULL);
    CHECK(md_patch(a, df, w, &o, &st, &e) == MD_OK && st.threads == 2,
          "pipelined data: the literals were not decoded on a second thread");
    close(a);
    close(df);
    close(w);
    check_patch("pipelined data", &old, &d, &nw);
    same_as_one_thread("pipelined data: intact", 0, &old, &d, 0);
    for (size_t f = 0; f < frames; f++) {
        size_t end = f + 1 < frames ? starts[f + 1] : d.n;
        size_t at[] = {starts[f], starts[f] + 1, starts[f] + 4, starts[f] + 12, starts[f] + 24, starts[f] + 39,
                       starts[f] + 40, starts[f] + 41, (starts[f] + end) / 2, end - 9, end - 1};
        for (size_t k = 0; k < sizeof at / sizeof at[0]; k++) {
            if (at[k] >= end) continue;
            d.p[at[k]] ^= 0x21;
            same_as_one_thread("pipelined data: corrupt byte", at[k], &old, &d, 0);
            d.p[at[k]] ^= 0x21;
            buf t = {d.p, at[k]};
            same_as_one_thread("pipelined data: truncated at", at[k], &old, &t, 0);
        }
    }
    for (size_t at = 100; at < n; at += n / 9) {
        old.p[at] ^= 1;
        same_as_one_thread("pipelined data: wrong basis at", at, &old, &d, 0);
        old.p[at] ^= 1;
    }
    for (uint64_t cap = 1; cap < n; cap += n / 5) same_as_one_thread("pipelined data: cap", (size_t)cap, &old, &d, cap);
    free(d.p);
    free(sig.p);
    free(old.p);
    free(nw.p);
}

/* A version 1 delta (made by hand here: header, one DATA frame, END) still patches. */
static void version1(void) {
    buf old = random_buf(10000), delta = {malloc(4096), 0}, out;
    uint8_t *p = delta.p;
    md_digest dg;
    md_error e;
    memset(p, 0, 4096);
    memcpy(p, "MRDNDLT\x01", 8);
    md_put_u32(p + 8, 1);
    md_put_u64(p + 16, old.n);
    md_digest_init(&dg);
    md_digest_update(&dg, old.p, old.n);
    md_digest_final(&dg, p + 24);
    md_digest_free(&dg);
    md_put_u64(p + 56, XXH3_64bits(p, 56));
    uint8_t *f = p + 64, *c = f + 32;
    size_t cl = md_put_varint(c, (uint64_t)5000 << 1 | 1);
    cl += md_put_varint(c + cl, md_zigzag(100));
    cl += md_put_varint(c + cl, (uint64_t)3 << 1);
    memcpy(c + cl, "new", 3);
    f[0] = MD_FRAME_DATA;
    md_put_u32(f + 4, (uint32_t)cl);
    md_put_u32(f + 8, 3);
    md_put_u32(f + 12, 3);
    md_put_u64(f + 24, XXH3_64bits(f, 24));
    md_put_u64(c + cl + 3, XXH3_64bits(f, 32 + cl + 3));
    uint8_t *end = c + cl + 3 + 8;
    buf want = {malloc(5003), 5003};
    memcpy(want.p, old.p + 100, 5000);
    memcpy(want.p + 5000, "new", 3);
    end[0] = MD_FRAME_END;
    md_put_u32(end + 4, 24);
    md_put_u64(end + 16, 1);
    md_put_u64(end + 24, XXH3_64bits(end, 24));
    md_put_u64(end + 32, want.n);
    md_digest_init(&dg);
    md_digest_update(&dg, want.p, want.n);
    md_digest_final(&dg, end + 40);
    md_digest_free(&dg);
    md_put_u64(end + 56, XXH3_64bits(end, 56));
    delta.n = (size_t)(end + 64 - p);
    check_patch("version 1", &old, &delta, &want);
    old.p[9999] ^= 1; /* outside the copy: version 1 still refuses, by OLD's digest */
    CHECK(apply(&old, &delta, &out, &e) == MD_E_WRONG_BASIS, "version 1: wrong basis accepted");
    free(out.p);
    free(old.p);
    free(delta.p);
    free(want.p);
}

/* Hostile safetensors headers are not safetensors: nothing kept, nothing read beyond. */
static void hostile_headers(void) {
    const char *bad[] = {
        "{\"t\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,99999]}}",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
        "{\"t\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,16],\"data_offsets\":[0,16]}}",
        "{\"t\":{\"dtype\":\"F32\",\"shape\":[-4],\"data_offsets\":[0,16]}}",
        "{\"t\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[16,0]}}",
        "{\"t\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},\"t\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[16,32]}}",
        "{\"t\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}",
        "{\"t\\u12\":{}}",
        "{\"t\":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        size_t jl = strlen(bad[i]);
        uint8_t file[4096] = {0};
        md_put_u64(file, jl);
        memcpy(file + 8, bad[i], jl);
        md_st st;
        CHECK(md_st_parse_mem(file, 8 + jl + 64, 8 + jl + 64, &st) == 0, "hostile header %zu accepted", i);
        CHECK(st.t == NULL && st.header == NULL, "hostile header %zu kept memory", i);
    }
    uint8_t huge[16] = {0};
    md_put_u64(huge, (uint64_t)1 << 62);
    huge[8] = '{';
    md_st st;
    CHECK(md_st_parse_mem(huge, sizeof huge, sizeof huge, &st) == 0, "absurd header length accepted");
    const char *good = "{\"__metadata__\":{\"k\":\"v\"},\"w\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,12]}}  ";
    uint8_t file[256] = {0};
    size_t jl = strlen(good);
    md_put_u64(file, jl);
    memcpy(file + 8, good, jl);
    CHECK(md_st_parse_mem(file, 8 + jl + 12, 8 + jl + 12, &st) == 1 && st.n == 1 && st.t[0].width == 2 &&
              st.t[0].off == 8 + jl && st.t[0].len == 12,
          "a good header was refused");
    md_st_free(&st);
}

/* rANS planes: exact round trips on skewed, constant, uniform and odd-length inputs;
 * every single-byte change of a coded plane is refused or decodes to other bytes of
 * the right length, never out of bounds (ASan watches). */
static void rans(void) {
    size_t sizes[] = {1, 3, 4, 7, 1000, 65537};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        for (int kind = 0; kind < 3; kind++) {
            size_t n = sizes[si];
            uint8_t *src = malloc(n), *back = malloc(n), *dst = malloc(md_rans_bound(n));
            uint32_t count[256] = {0};
            for (size_t i = 0; i < n; i++) {
                uint64_t r = rnd();
                src[i] = kind == 0 ? (uint8_t)((r % 100) < 90 ? 0 : r % 7) : kind == 1 ? 42 : (uint8_t)r;
                count[src[i]]++;
            }
            size_t len = md_rans_encode(src, n, count, dst, md_rans_bound(n));
            CHECK(len > 0, "rans: %zu bytes, kind %d: no room", n, kind);
            CHECK(md_rans_decode(dst, len, back, n) == 0 && memcmp(back, src, n) == 0,
                  "rans: %zu bytes, kind %d: round trip", n, kind);
            if (kind == 0 && n == 65537) CHECK(len < n / 3, "rans: skewed plane coded in %zu bytes", len);
            for (size_t i = 0; i < len; i = sample_next(i, len)) {
                dst[i] ^= 0x40;
                (void)md_rans_decode(dst, len, back, n);
                dst[i] ^= 0x40;
            }
            CHECK(md_rans_decode(dst, len - 1, back, n) != 0, "rans: a cut plane decoded");
            free(src);
            free(back);
            free(dst);
        }
    }
}

/* The 32- and 64-state rANS of plane codecs 3 and 4: exact round trips on skewed,
 * constant, uniform and bell-shaped inputs and alphabets of 32, 33, 64, 65 and 200
 * symbols, and one symbol of ~98% in the middle of the alphabet (the AVX-512
 * decoder's path without the table gather), of lengths around the group sizes, the
 * AVX-512 VBMI, AVX-512, AVX2 and portable coders (switch levels 0, 3, 2, 1) writing and reading the
 * same bytes; an output that does not fit is refused; single-byte changes and cuts
 * are refused or stay in bounds (ASan watches); a plane is not read with the other
 * codec's state count. */
static void rans16_lanes(unsigned lanes) {
    size_t sizes[] = {1, 31, 32, 33, 63, 64, 65, 95, 97, 127, 129, 1000, 4099, 65537, 200003};
    /* best kernel, AVX-512 without VBMI at most, AVX2 at most, portable */
    static const int levels[] = {0, 3, 2, 1};
    const int nl = (int)(sizeof levels / sizeof levels[0]);
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        for (int kind = 0; kind < 10; kind++) {
            size_t n = sizes[si], cap = 2 * n + 1024;
            uint8_t *src = malloc(n), *back = malloc(n), *dst = malloc(cap), *dst_p = malloc(cap);
            uint32_t count[256] = {0};
            for (size_t i = 0; i < n; i++) {
                uint64_t r = rnd();
                unsigned bell = 0;
                for (int k = 0; k < 40; k++) bell += (unsigned)((r >> (k % 32)) & 3) % 3;
                /* kinds 4 and 5: 32 and 33 symbols, half of them near 255; 6, 7 and 8:
                 * 64, 65 and 200 spread over all values (the VBMI kernel looks the
                 * symbols' constants up in pieces of 32 ranks: one, two, three, seven) */
                src[i] = kind == 0 ? (uint8_t)((r % 100) < 90 ? 0 : r % 7)
                         : kind == 1 ? 42
                         : kind == 2 ? (uint8_t)r
                         : kind == 3 ? (uint8_t)bell
                         : kind == 4 ? (uint8_t)(r % 32 < 16 ? r % 16 : 255 - r % 16)
                         : kind == 5 ? (uint8_t)(r % 33 < 17 ? r % 17 : 255 - r % 16)
                         : kind == 6 ? (uint8_t)(r % 64 * 4)
                         : kind == 7 ? (uint8_t)(r % 65 * 3)
                         : kind == 8 ? (uint8_t)(r % 200 + 30)
                                     : (uint8_t)(r % 1000 < 980 ? 128 : 124 + r % 9);
                count[src[i]]++;
            }
            md_set_portable(0);
            size_t len = md_rans16_encode(src, n, count, dst, cap, lanes);
            CHECK(len > 0, "rans16/%u: %zu bytes, kind %d: not coded", lanes, n, kind);
            for (int l = 1; l < nl; l++) {
                md_set_portable(levels[l]);
                memset(dst_p, 0, cap);
                size_t len_p = md_rans16_encode(src, n, count, dst_p, cap, lanes);
                CHECK(len == len_p && memcmp(dst, dst_p, len) == 0,
                      "rans16/%u: %zu bytes, kind %d: level %d writes other bytes", lanes, n, kind, levels[l]);
            }
            for (int l = 0; l < nl; l++) {
                md_set_portable(levels[l]);
                memset(back, 0, n);
                CHECK(md_rans16_decode(dst, len, back, n, lanes) == 0 && memcmp(back, src, n) == 0,
                      "rans16/%u: %zu bytes, kind %d: round trip at level %d", lanes, n, kind, levels[l]);
            }
            md_set_portable(0);
            if (n >= 200) /* the other state count reads other states: refused or wrong, never a crash */
                CHECK(md_rans16_decode(dst, len, back, n, 96 - lanes) != 0 || memcmp(back, src, n) != 0 ||
                          kind == 1,
                      "rans16/%u: %zu bytes, kind %d: decoded with %u states", lanes, n, kind, 96 - lanes);
            CHECK(md_rans16_decode(dst, len, back, n, 48) != 0 && md_rans16_encode(src, n, count, dst_p, cap, 16) == 0,
                  "rans16: a state count other than 32 or 64 accepted");
            if (kind == 0 && n == 200003) CHECK(len < n / 3, "rans16/%u: skewed plane coded in %zu bytes", lanes, len);
            if (kind == 2 && n >= 1000)
                CHECK(md_rans16_encode(src, n, count, dst_p, n, lanes) == 0,
                      "rans16/%u: a uniform plane fit in raw size", lanes);
            for (size_t i = 0; i < len; i = sample_next_sparse(i, len)) {
                dst[i] ^= 0x40;
                for (int l = 0; l < nl; l++) {
                    md_set_portable(levels[l]);
                    (void)md_rans16_decode(dst, len, back, n, lanes);
                }
                md_set_portable(0);
                dst[i] ^= 0x40;
            }
            /* two planes at once: with a partner of another length of stream (the
             * uniform plane), each must come out as alone, and damage to either fails */
            {
                uint8_t *other = malloc(n), *oenc = malloc(cap), *oback = malloc(n);
                uint32_t oc[256] = {0};
                for (size_t i = 0; i < n; i++) oc[other[i] = (uint8_t)rnd()]++;
                size_t olen = md_rans16_encode(other, n, oc, oenc, cap, lanes);
                {
                    /* the pair coder writes what the single one does */
                    uint8_t *pa = malloc(cap), *pb = malloc(cap);
                    size_t la, lb;
                    for (int l = 0; l < nl; l++) {
                        md_set_portable(levels[l]);
                        md_rans16_encode2(src, count, pa, &la, other, oc, pb, &lb, n, cap, lanes);
                        CHECK(la == len && lb == olen && memcmp(pa, dst, len) == 0 && memcmp(pb, oenc, olen) == 0,
                              "rans16/%u: %zu bytes, kind %d: the pair coder (level %d) writes other bytes", lanes,
                              n, kind, levels[l]);
                    }
                    free(pa);
                    free(pb);
                }
                for (int l = 0; l < nl; l++) {
                    md_set_portable(levels[l]);
                    memset(back, 0, n);
                    memset(oback, 0, n);
                    CHECK(olen > 0 && md_rans16_decode2(dst, len, back, oenc, olen, oback, n, lanes) == 0 &&
                              memcmp(back, src, n) == 0 && memcmp(oback, other, n) == 0,
                          "rans16/%u: %zu bytes, kind %d: pair round trip (level %d)", lanes, n, kind, levels[l]);
                    CHECK(md_rans16_decode2(oenc, olen, oback, dst, len, back, n, lanes) == 0 &&
                              memcmp(back, src, n) == 0,
                          "rans16/%u: %zu bytes, kind %d: pair round trip, swapped", lanes, n, kind);
                    CHECK(md_rans16_decode2(dst, len - 1, back, oenc, olen, oback, n, lanes) != 0 &&
                              md_rans16_decode2(oenc, olen, oback, dst, len - 1, back, n, lanes) != 0,
                          "rans16/%u: %zu bytes, kind %d: a cut plane decoded in a pair", lanes, n, kind);
                }
                md_set_portable(0);
                free(other);
                free(oenc);
                free(oback);
            }
            CHECK(md_rans16_decode(dst, len - 1, back, n, lanes) != 0, "rans16/%u: a cut plane decoded", lanes);
            /* (a constant plane codes no length: the frame gives it; a short skewed
             * plane can come out constant too) */
            CHECK(n < 2 || count[src[0]] == n || md_rans16_decode(dst, len, back, n - 1, lanes) != 0,
                  "rans16/%u: %zu bytes, kind %d: a plane decoded short", lanes, n, kind);
            free(src);
            free(back);
            free(dst);
            free(dst_p);
        }
    }
}

/* One section per state count: the sanitized run's two parts take one each. */
static void rans16_32(void) { rans16_lanes(32); }
static void rans16_64(void) { rans16_lanes(64); }

/* The numeric model's kernels (AVX-512 VBMI, the compiler's loops, the byte-wise
 * ones): the same planes from every level and back to NEW exactly, for every
 * element width, lengths around the 64-byte vector, and elements at the extremes
 * (differences that wrap, the most negative one). */
static void num_kernels(void) {
    static const int levels[] = {0, 3, 2, 1};
    size_t lens[] = {0, 1, 7, 8, 63, 64, 65, 127, 128, 129, 1000, 4096 + 24};
    for (unsigned w = 1; w <= 8; w *= 2)
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            size_t len = lens[li] / w * w;
            uint8_t *old = malloc(len + 1), *nw = malloc(len + 1), *pl = malloc(len + 1), *pl_p = malloc(len + 1),
                    *back = malloc(len + 1);
            for (size_t i = 0; i < len; i++) {
                uint64_t r = rnd();
                old[i] = (uint8_t)r;
                /* a third of the bytes equal, a third near, a third anything; every
                 * 5th element 0x80..00 against 0x7f..ff and the reverse */
                nw[i] = r % 3 == 0   ? old[i]
                        : r % 3 == 1 ? (uint8_t)(old[i] + (r >> 8) % 5 - 2)
                                     : (uint8_t)(r >> 16);
                if ((i / w) % 5 == 0) {
                    int top = i % w == w - 1;
                    old[i] = top ? 0x80 : 0x00;
                    nw[i] = top ? 0x7f : 0xff;
                    if ((i / w) % 10 == 0) {
                        uint8_t t = old[i];
                        old[i] = nw[i];
                        nw[i] = t;
                    }
                }
            }
            md_set_portable(0);
            md_num_encode(old, nw, len, w, pl);
            for (int l = 0; l < 4; l++) {
                md_set_portable(levels[l]);
                memset(pl_p, 0xAA, len + 1);
                md_num_encode(old, nw, len, w, pl_p);
                CHECK(memcmp(pl, pl_p, len) == 0 && pl_p[len] == 0xAA,
                      "numeric model, width %u, %zu bytes: level %d writes other planes", w, len, levels[l]);
                memset(back, 0xAA, len + 1);
                md_num_decode(old, pl, len, w, back);
                CHECK(memcmp(back, nw, len) == 0 && back[len] == 0xAA,
                      "numeric model, width %u, %zu bytes: level %d decodes other bytes", w, len, levels[l]);
            }
            md_set_portable(0);
            free(old);
            free(nw);
            free(pl);
            free(pl_p);
            free(back);
        }
}

/* The XXH3 kernels (AVX-512, AVX2, the shared library: levels 0, 2, 1): the same
 * one-shot hashes, and the same streamed hash whatever the pieces, for lengths around
 * XXH3's stripes and blocks; a state streamed partly under one level and finished
 * under another still agrees (the states are one type). */
static void hash_kernels(void) {
    static const int levels[] = {0, 3, 2, 1};
    size_t lens[] = {0, 1, 16, 17, 128, 129, 240, 241, 1023, 1024, 1025, 4096, 65536 + 7, 300000};
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        size_t len = lens[li];
        uint8_t *p = malloc(len + 1), want[16], got[16];
        for (size_t i = 0; i < len; i++) p[i] = (uint8_t)rnd();
        md_set_portable(1);
        md_h128(p, len, want);
        uint64_t want64 = md_h64(p, len, 12345);
        for (int l = 0; l < 4; l++) {
            md_set_portable(levels[l]);
            md_h128(p, len, got);
            CHECK(memcmp(got, want, 16) == 0, "XXH3-128 of %zu bytes differs at level %d", len, levels[l]);
            CHECK(md_h64(p, len, 12345) == want64, "XXH3-64 of %zu bytes differs at level %d", len, levels[l]);
            void *st = md_h128_new();
            CHECK(st != NULL, "no hash state");
            md_h128_reset(st);
            size_t at = 0;
            for (size_t piece = 1; at < len; piece = piece * 3 + 1) {
                size_t take = len - at < piece ? len - at : piece;
                /* halfway, the other levels in turn: the state carries over */
                if (at >= len / 2) md_set_portable(levels[(l + 1) % 4]);
                md_h128_update(st, p + at, take);
                at += take;
            }
            md_h128_digest(st, got);
            md_h128_free(st);
            CHECK(memcmp(got, want, 16) == 0, "streamed XXH3-128 of %zu bytes differs from level %d", len,
                  levels[l]);
        }
        md_set_portable(0);
        free(p);
    }
}

/* The writer: pieces of every size relative to its buffer (small, one short of a
 * buffer, whole buffers, several and a bit) reach the file in order, and every write
 * it makes starts at a multiple of the buffer's size (checked as it goes: whenever
 * the buffer is empty, all it emitted is whole buffers), so the page cache of a fresh
 * output is filled as a plain copy in 1 MiB calls fills it. */
static void writer_pieces(void) {
    const size_t cap = 4096;
    size_t sizes[] = {1, 7, 127, 128, 129, 4095, 4096, 4097, 8192, 12289, 3, 20000, 5, 4096, 1, 40000};
    size_t total = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) total += sizes[i];
    buf want = random_buf(total);
    int fd = mem_fd(NULL);
    md_writer w;
    CHECK(md_writer_init(&w, fd, cap) == 0, "writer: init");
    size_t at = 0;
    for (int round = 0; round < 2; round++)
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0] && at < total; i++) {
            size_t n = round ? sizes[sizeof sizes / sizeof sizes[0] - 1 - i] / 3 + 1 : sizes[i];
            if (n > total - at) n = total - at;
            CHECK(md_writer_put(&w, want.p + at, n) == 0, "writer: put %zu bytes", n);
            at += n;
            CHECK(w.total == at, "writer: %llu bytes counted, %zu put", (unsigned long long)w.total, at);
            CHECK(w.len != 0 || w.emitted % cap == 0, "writer: a write ended at %llu, not on a buffer boundary",
                  (unsigned long long)w.emitted);
        }
    CHECK(md_writer_finish(&w) == 0, "writer: finish");
    md_writer_free(&w);
    buf got = fd_contents(fd);
    CHECK(got.n == at && memcmp(got.p, want.p, at) == 0, "writer: the file differs from the pieces put");
    close(fd);
    free(got.p);
    free(want.p);
}

/* Threads beyond what the engine uses are refused, not silently capped. */
static void threads_refused(void) {
    buf old = random_buf(1000), sig;
    CHECK(make_sig(&old, 5, 0, &sig) == MD_E_INVALID, "5 threads accepted");
    free(sig.p);
    free(old.p);
}

/* Seeds: small valid signatures and deltas (against the basis fuzz_delta uses). */
static int write_seeds(const char *sig_dir, const char *delta_dir, const char *st_dir) {
    if (st_dir) {
        size_t c[] = {64, 16, 3};
        float v[83];
        for (size_t i = 0; i < 83; i++) v[i] = (float)i * 0.01f;
        buf st = safetensors(c, 3, v);
        write_file(st_dir, "seed1", &st);
        free(st.p);
        /* planes of 1,500 symbols: codec 4 in the fuzz builds (MD_RANS64_MIN 1024) */
        size_t c2[] = {1500, 40};
        float *v2 = malloc(1540 * sizeof *v2);
        for (size_t i = 0; i < 1540; i++) v2[i] = (float)(i % 97) * 0.003f - 0.1f;
        st = safetensors(c2, 2, v2);
        write_file(st_dir, "seed2", &st);
        free(st.p);
        free(v2);
    }
    buf old = {malloc(4096), 4096}, sig, delta;
    md_error e;
    for (size_t i = 0; i < old.n; i++) old.p[i] = (uint8_t)(i * 7 + i / 256);
    make_sig(&old, 1, 256, &sig);
    write_file(sig_dir, "seed1", &sig);
    buf nw = random_buf(3000);
    memcpy(nw.p + 1000, old.p + 512, 1024);
    make_delta(&sig, &nw, 1, &delta, &e);
    write_file(delta_dir, "seed1", &delta);
    free(delta.p);
    make_delta(&sig, &old, 1, &delta, &e);
    write_file(delta_dir, "seed2", &delta);
    free(delta.p);
    /* numeric frames of every width against the same basis */
    buf near = {malloc(4096), 4096};
    for (size_t i = 0; i < near.n; i++) near.p[i] = (uint8_t)(old.p[i] + (i % 3 == 0));
    for (uint32_t w = 1; w <= 8; w *= 2) {
        char name[32];
        make_basis(&old, &near, 1, w, &delta, &e);
        snprintf(name, sizeof name, "numeric%u", w);
        write_file(delta_dir, name, &delta);
        free(delta.p);
    }
    free(near.p);
    free(sig.p);
    free(nw.p);
    free(old.p);
    return 0;
}

/* MD_DURABLE into a real file (writeback started as it goes) gives the same bytes,
 * and a wrong basis still leaves the file empty. */
static void durable(void) {
    buf old = random_buf(20 << 20), nw = random_buf(20 << 20), sig, delta, out;
    md_error e;
    memcpy(nw.p + (1 << 20), old.p, 18 << 20);
    CHECK(make_sig(&old, 1, 0, &sig) == MD_OK, "durable: signature");
    CHECK(make_delta(&sig, &nw, 1, &delta, &e) == MD_OK, "durable: delta: %s", e.message);
    char path[] = "/tmp/md_test_durable_XXXXXX";
    for (int wrong = 0; wrong < 2; wrong++) {
        int w = mkstemp(path);
        CHECK(w >= 0, "durable: mkstemp");
        unlink(path);
        old.p[7] ^= (uint8_t)wrong;
        int a = mem_fd(&old), d = mem_fd(&delta);
        old.p[7] ^= (uint8_t)wrong;
        md_options o = {.threads = 1, .block_len = 0, .flags = MD_DURABLE};
        md_status rc = md_patch(a, d, w, &o, NULL, &e);
        out = fd_contents(w);
        if (wrong) {
            CHECK(rc == MD_E_WRONG_BASIS && out.n == 0, "durable: wrong basis gave %d, %zu bytes", rc, out.n);
        } else {
            CHECK(rc == MD_OK, "durable: patch: %s", e.message);
            CHECK(out.n == nw.n && memcmp(out.p, nw.p, nw.n) == 0, "durable: round trip");
        }
        free(out.p);
        close(a);
        close(d);
        close(w);
        memcpy(path + strlen(path) - 6, "XXXXXX", 6);
    }
    free(old.p);
    free(nw.p);
    free(sig.p);
    free(delta.p);
}

/* Whether any extent of fd is still waiting for delayed allocation; -1 when the file
 * system has no FIEMAP. */
static int has_delalloc(int fd) {
    struct {
        struct fiemap fm;
        struct fiemap_extent ext[64];
    } q;
    memset(&q, 0, sizeof q);
    q.fm.fm_length = FIEMAP_MAX_OFFSET;
    q.fm.fm_extent_count = 64;
    if (ioctl(fd, FS_IOC_FIEMAP, &q.fm) != 0) return -1;
    for (uint32_t i = 0; i < q.fm.fm_mapped_extents; i++)
        if (q.ext[i].fe_flags & FIEMAP_EXTENT_DELALLOC) return 1;
    return 0;
}

/* A patch into a fresh file on ext4 allocates the blocks of each write before it
 * (fallocate): none waits for delayed allocation afterwards; zero
 * runs are still holes and nothing is allocated past the end; a wrong basis leaves
 * no block behind. */
static void patch_prealloc(void) {
    const size_t mib = (size_t)1 << 20;
    buf old = random_buf(4 * mib), nw = random_buf(3 * mib + 384 * 1024), sig, delta, out;
    md_error e;
    memcpy(nw.p + 100, old.p, 2 * mib);       /* copies shifted off page boundaries */
    memset(nw.p + 2 * mib + 100, 0, 256 * 1024); /* a hole inside */
    memset(nw.p + nw.n - 192 * 1024, 0, 192 * 1024); /* and at the end */
    CHECK(make_sig(&old, 1, 0, &sig) == MD_OK, "prealloc: signature");
    CHECK(make_delta(&sig, &nw, 1, &delta, &e) == MD_OK, "prealloc: delta: %s", e.message);
    char path[] = "/tmp/md_test_prealloc_XXXXXX";
    for (int wrong = 0; wrong < 2; wrong++) {
        int w = mkstemp(path);
        CHECK(w >= 0, "prealloc: mkstemp");
        unlink(path);
        memcpy(path + strlen(path) - 6, "XXXXXX", 6);
        if (!md_prealloc_pays(w)) {
            fprintf(stderr, "md_test: prealloc: /tmp is not ext4, skipped\n");
            close(w);
            break;
        }
        old.p[5] ^= (uint8_t)wrong;
        int a = mem_fd(&old), d = mem_fd(&delta);
        old.p[5] ^= (uint8_t)wrong;
        md_options o = {.threads = 1};
        md_status rc = md_patch(a, d, w, &o, NULL, &e);
        struct stat st;
        CHECK(fstat(w, &st) == 0, "prealloc: fstat");
        if (wrong) {
            CHECK(rc == MD_E_WRONG_BASIS && st.st_size == 0 && st.st_blocks == 0,
                  "prealloc: wrong basis gave %d, %lld bytes, %lld blocks", rc, (long long)st.st_size,
                  (long long)st.st_blocks);
        } else {
            CHECK(rc == MD_OK, "prealloc: patch: %s", e.message);
            out = fd_contents(w);
            CHECK(out.n == nw.n && memcmp(out.p, nw.p, nw.n) == 0, "prealloc: round trip");
            free(out.p);
            /* 3 MiB of data (the holes are whole 64 KiB grains of zeros, less the edges) */
            CHECK((uint64_t)st.st_blocks * 512 <= 3 * mib + 64 * 1024, "prealloc: %lld bytes allocated for %zu",
                  (long long)st.st_blocks * 512, nw.n);
            off_t hole = lseek(w, 0, SEEK_HOLE);
            CHECK(hole > (off_t)(2 * mib) && hole < (off_t)(2 * mib + 256 * 1024), "prealloc: the first hole is at %lld",
                  (long long)hole);
            CHECK(has_delalloc(w) != 1, "prealloc: the output waits for delayed allocation");
        }
        close(a);
        close(d);
        close(w);
    }
    free(old.p);
    free(nw.p);
    free(sig.p);
    free(delta.p);
}

static double now_s(clockid_t clock) {
    struct timespec t;
    clock_gettime(clock, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void defaults(void) {
    CHECK(md_default_block_len(0) == MD_MIN_BLOCK_LEN, "default block of empty");
    CHECK(md_default_block_len((uint64_t)1 << 30) == 32768, "default block of 1 GiB");
}

/* The sections, in the order a plain run takes them. `md_test --part K/N` runs every
 * N-th section from the K-th (1-based), so the slow sanitized build can run as N
 * processes at once on N cores; every section belongs to exactly one part. */
static const struct {
    const char *name;
    void (*run)(void);
} sections[] = {
    {"defaults", defaults}, {"edge_cases", edge_cases}, {"corruption", corruption},
    {"durable", durable},   {"numeric", numeric},       {"version1", version1},
    {"hostile_headers", hostile_headers}, {"rans", rans}, {"rans16_32", rans16_32}, {"rans16_64", rans16_64},
    {"threads_refused", threads_refused}, {"num_kernels", num_kernels}, {"patch_pipelined", patch_pipelined},
    {"hash_kernels", hash_kernels}, {"writer_pieces", writer_pieces},
    {"patch_prealloc", patch_prealloc}, {"patch_pipelined_data", patch_pipelined_data},
};

int main(int argc, char **argv) {
    if ((argc == 4 || argc == 5) && strcmp(argv[1], "--write-seeds") == 0)
        return write_seeds(argv[2], argv[3], argc == 5 ? argv[4] : NULL);
    unsigned part = 1, parts = 1;
    if (argc == 3 && strcmp(argv[1], "--part") == 0) {
        if (sscanf(argv[2], "%u/%u", &part, &parts) != 2 || parts == 0 || part == 0 || part > parts) {
            fprintf(stderr, "md_test: --part wants K/N with 1 <= K <= N, not %s\n", argv[2]);
            return 2;
        }
    } else if (argc != 1) {
        fprintf(stderr, "usage: md_test [--part K/N] | --write-seeds SIG DELTA [ST]\n");
        return 2;
    }
    const size_t ns = sizeof sections / sizeof sections[0];
    for (size_t i = part - 1; i < ns; i += parts) {
        rng_state = 0x9E3779B97F4A7C15ull; /* a section's data does not depend on which ran before */
        double t0 = now_s(CLOCK_MONOTONIC), c0 = now_s(CLOCK_PROCESS_CPUTIME_ID);
        sections[i].run();
        fprintf(stderr, "md_test: %s %.1f s (CPU %.1f s)\n", sections[i].name, now_s(CLOCK_MONOTONIC) - t0,
                now_s(CLOCK_PROCESS_CPUTIME_ID) - c0);
    }
    if (failures) {
        fprintf(stderr, "%d failures\n", failures);
        return 1;
    }
    if (parts > 1)
        printf("md_test: part %u/%u passed\n", part, parts);
    else
        printf("md_test: all passed\n");
    return 0;
}
