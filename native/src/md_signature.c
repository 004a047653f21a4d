/* Signature: writing it (one pass over OLD, chunks in parallel), reading and
 * validating it, and building the search index the delta uses. */
#include <errno.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>

#include "md_internal.h"

uint32_t md_default_block_len(uint64_t file_len) {
    /* About the square root of the size: the delta then costs about as much in
     * signature as in the block of literal each edit forces. */
    uint64_t r = 1;
    while (r * r < file_len && r < MD_MAX_BLOCK_LEN) r <<= 1;
    uint64_t lo = r >> 1, hi = r;
    while (lo + 1 < hi) { /* integer sqrt, rounded up */
        uint64_t mid = (lo + hi) / 2;
        if (mid * mid >= file_len) hi = mid; else lo = mid;
    }
    uint64_t n = hi & ~(uint64_t)63; /* rounded down: never coarser than rdiff */
    if (n < MD_MIN_BLOCK_LEN) n = MD_MIN_BLOCK_LEN;
    if (n > MD_MAX_BLOCK_LEN) n = MD_MAX_BLOCK_LEN;
    return (uint32_t)n;
}

static unsigned log2_ceil(uint64_t v) {
    unsigned b = 0;
    while (b < 64 && ((uint64_t)1 << b) < v) b++;
    return b;
}

uint32_t md_strong_len_for(uint64_t file_len, uint32_t block_len) {
    /* A false match needs a weak (64-bit) and a strong collision; keep the strong
     * part alone below 2^-40 per pair of (block, position) over the file. */
    uint64_t blocks = file_len / block_len + 1;
    unsigned bits = 40 + log2_ceil(file_len + 1) + log2_ceil(blocks);
    uint32_t bytes = (bits + 7) / 8;
    if (bytes < 8) bytes = 8;
    if (bytes > 16) bytes = 16;
    return bytes;
}

void md_strong(const uint8_t *p, size_t n, uint32_t strong_len, uint8_t *out) {
    uint8_t full[16];
    md_h128(p, n, full);
    memcpy(out, full, strong_len);
}

static uint64_t header_checksum(const uint8_t *hdr) { return XXH3_64bits(hdr, 56); }

/* ---------------- writing ---------------- */

typedef struct sig_round {
    const uint8_t *buf;   /* file bytes from `base` */
    uint64_t base, file_len, round_end;
    uint32_t n, strong_len;
    uint64_t first_block; /* index of the first block starting in this round */
    uint8_t *entries;     /* (8 + strong_len) per block of the round */
    uint8_t (*chunk_digests)[16];
} sig_round;

static void sig_chunk_task(void *arg, size_t i, uint32_t worker) {
    (void)worker;
    sig_round *r = arg;
    uint64_t c0 = r->base + (uint64_t)i * MD_CHUNK_LEN;
    uint64_t c1 = c0 + MD_CHUNK_LEN;
    if (c1 > r->file_len) c1 = r->file_len;
    md_chunk_digest(r->buf + (c0 - r->base), (size_t)(c1 - c0), r->chunk_digests[i]);
    uint64_t b = (c0 + r->n - 1) / r->n;
    size_t esz = 8u + r->strong_len;
    for (;; b++) {
        uint64_t start = b * r->n;
        if (start >= c1) break;
        uint64_t len = r->file_len - start < r->n ? r->file_len - start : r->n;
        const uint8_t *p = r->buf + (start - r->base);
        uint8_t *e = r->entries + (b - r->first_block) * esz;
        uint32_t s1, s2;
        md_weak_block(p, (size_t)len, &s1, &s2);
        md_put_u32(e, s1);
        md_put_u32(e + 4, s2);
        md_strong(p, (size_t)len, r->strong_len, e + 8);
    }
}

typedef struct sig_frames {
    md_writer *w;
    uint8_t *frame;
    size_t len;
    uint32_t count;
    uint64_t index;
    uint64_t seed;
} sig_frames;

static int sig_flush_frame(sig_frames *f) {
    if (!f->count) return 0;
    uint64_t sum = XXH3_64bits_withSeed(f->frame, f->len, f->seed + f->index);
    md_put_u64(f->frame + f->len, sum);
    int rc = md_writer_put(f->w, f->frame, f->len + 8);
    f->len = 0;
    f->count = 0;
    f->index++;
    return rc;
}

md_status md_signature(int old_fd, int sig_fd, const md_options *opt, md_stats *stats,
                       md_error *err) {
    struct stat st;
    uint32_t threads;
    md_status rc = md_begin(opt, &threads, err);
    if (rc != MD_OK) return rc;
    if (fstat(old_fd, &st) != 0) return md_fail_io(err, errno, "reading OLD");
    if (!S_ISREG(st.st_mode))
        return md_fail(err, MD_E_INVALID, "OLD must be a regular file.");
    uint64_t file_len = (uint64_t)st.st_size;
    uint32_t n = opt && opt->block_len ? opt->block_len : md_default_block_len(file_len);
    if (n < MD_MIN_BLOCK_LEN || n > MD_MAX_BLOCK_LEN)
        return md_fail(err, MD_E_INVALID, "block size %u is outside %u..%u bytes.", n,
                       MD_MIN_BLOCK_LEN, MD_MAX_BLOCK_LEN);
    uint32_t strong_len = md_strong_len_for(file_len, n);
    uint64_t block_count = file_len / n + (file_len % n != 0);
    size_t esz = 8u + strong_len;
    uint32_t k = threads < MD_ROUND_CHUNKS_MAX ? threads : MD_ROUND_CHUNKS_MAX;
    uint64_t round_bytes = (uint64_t)k * MD_CHUNK_LEN;
    size_t buf_cap = (size_t)(round_bytes + n < file_len + 1 ? round_bytes + n : file_len + 1);
    size_t max_round_blocks = (size_t)(round_bytes / n + 2);

    uint8_t *buf = malloc(buf_cap);
    uint8_t *entries = malloc(max_round_blocks * esz);
    uint8_t(*digests)[16] = malloc(sizeof(*digests) * k);
    uint8_t *frame = malloc(MD_SIG_FRAME_ENTRIES * esz + 8);
    md_writer w = {0};
    md_digest dg = {0};
    int w_ok = md_writer_init(&w, sig_fd, 1 << 20) == 0;
    int d_ok = md_digest_init(&dg) == 0;
    if (!buf || !entries || !digests || !frame || !w_ok || !d_ok) {
        rc = md_fail(err, MD_E_NOMEM, "out of memory while writing a signature.");
        goto done;
    }

    uint8_t hdr[MD_HEADER_LEN] = {0};
    memcpy(hdr, MD_SIG_MAGIC, 8);
    md_put_u32(hdr + 8, MD_SIG_VERSION);
    md_put_u32(hdr + 12, n);
    md_put_u32(hdr + 16, strong_len);
    md_put_u32(hdr + 20, 0);
    md_put_u64(hdr + 24, file_len);
    md_put_u64(hdr + 32, block_count);
    uint64_t hsum = header_checksum(hdr);
    md_put_u64(hdr + 56, hsum);
    md_writer_put(&w, hdr, sizeof hdr);

    sig_frames fr = {&w, frame, 0, 0, 0, hsum};
    uint64_t base = 0, have = 0, next_block = 0;
    while (base < file_len) {
        if (md_cancelled(opt)) {
            rc = md_fail(err, MD_E_CANCELLED, "the signature was cancelled.");
            goto done;
        }
        uint64_t want = file_len - base < round_bytes + n ? file_len - base : round_bytes + n;
        if (have < want) {
            int64_t got = md_read_full(old_fd, buf + have, (size_t)(want - have));
            if (got < 0) {
                rc = md_fail_io(err, errno, "reading OLD");
                goto done;
            }
            if ((uint64_t)got != want - have) {
                rc = md_fail(err, MD_E_IO, "OLD shrank while its signature was being made.");
                goto done;
            }
            have = want;
        }
        sig_round r;
        r.buf = buf;
        r.base = base;
        r.file_len = file_len;
        r.round_end = base + round_bytes < file_len ? base + round_bytes : file_len;
        r.n = n;
        r.strong_len = strong_len;
        r.first_block = next_block;
        r.entries = entries;
        r.chunk_digests = digests;
        size_t chunks = (size_t)((r.round_end - base + MD_CHUNK_LEN - 1) / MD_CHUNK_LEN);
        md_parallel_for(threads, chunks, sig_chunk_task, &r);
        for (size_t i = 0; i < chunks; i++) {
            uint64_t c0 = base + i * MD_CHUNK_LEN;
            uint64_t c1 = c0 + MD_CHUNK_LEN < file_len ? c0 + MD_CHUNK_LEN : file_len;
            md_digest_add_chunk(&dg, digests[i], c1 - c0);
        }
        uint64_t end_block = (r.round_end + n - 1) / n;
        for (uint64_t b = next_block; b < end_block; b++) {
            memcpy(frame + fr.len, entries + (b - next_block) * esz, esz);
            fr.len += esz;
            if (++fr.count == MD_SIG_FRAME_ENTRIES && sig_flush_frame(&fr) != 0) break;
        }
        next_block = end_block;
        if (w.failed_errno) {
            rc = md_fail_io(err, w.failed_errno, "writing the signature");
            goto done;
        }
        if (opt && opt->progress) __atomic_store_n(opt->progress, r.round_end, __ATOMIC_RELAXED);
        uint64_t consumed = r.round_end - base;
        memmove(buf, buf + consumed, (size_t)(have - consumed));
        have -= consumed;
        base = r.round_end;
    }
    /* A file that grew since fstat would silently lose its tail: refuse it. */
    {
        uint8_t probe;
        int64_t extra = md_read_full(old_fd, &probe, 1);
        if (extra != 0) {
            rc = extra < 0 ? md_fail_io(err, errno, "reading OLD")
                           : md_fail(err, MD_E_IO, "OLD grew while its signature was being made.");
            goto done;
        }
    }
    sig_flush_frame(&fr);
    uint8_t trailer[24];
    md_digest_final(&dg, trailer);
    md_put_u64(trailer + 16, XXH3_64bits_withSeed(trailer, 16, hsum + fr.index));
    md_writer_put(&w, trailer, sizeof trailer);
    if (md_writer_flush(&w) != 0) {
        rc = md_fail_io(err, w.failed_errno, "writing the signature");
        goto done;
    }
    if (stats) {
        memset(stats, 0, sizeof *stats);
        stats->input_bytes = file_len;
        stats->output_bytes = w.total;
        stats->block_len = n;
        stats->strong_len = strong_len;
        stats->threads = threads;
    }
done:
    free(buf);
    free(entries);
    free(digests);
    free(frame);
    md_writer_free(&w);
    md_digest_free(&dg);
    return rc;
}

/* ---------------- reading ---------------- */

void md_sig_free(md_sig *sig) {
    if (!sig) return;
    free(sig->s1);
    free(sig->s2);
    free(sig->strong);
    free(sig->sorted_key);
    free(sig->sorted_idx);
    free(sig->slots);
    free(sig->bitmap);
    free(sig->filter2);
    free(sig);
}

uint64_t md_sig_block_count(const md_sig *sig) { return sig->block_count; }

static md_status sig_corrupt(md_error *err, const char *why) {
    return md_fail(err, MD_E_CORRUPT_SIGNATURE, "the signature is corrupt: %s.", why);
}

static int grow(void **p, size_t elem, uint64_t need, uint64_t *cap) {
    if (need <= *cap) return 0;
    uint64_t nc = *cap ? *cap * 2 : 4096;
    while (nc < need) nc *= 2;
    void *q = realloc(*p, (size_t)(nc * elem));
    if (!q) return -1;
    *p = q;
    *cap = nc;
    return 0;
}

md_status md_sig_load(int sig_fd, md_sig **out, md_error *err) {
    uint8_t hdr[MD_HEADER_LEN];
    md_status rc = MD_OK;
    uint8_t *frame = NULL;
    *out = NULL;
    int64_t got = md_read_full(sig_fd, hdr, sizeof hdr);
    if (got < 0) return md_fail_io(err, errno, "reading the signature");
    if (got < (int64_t)sizeof hdr) return sig_corrupt(err, "it is shorter than its header");
    if (memcmp(hdr, MD_SIG_MAGIC, 7) != 0) return sig_corrupt(err, "it is not a Meridian signature");
    if (MD_VERIFY_CHECKSUMS && md_get_u64(hdr + 56) != header_checksum(hdr))
        return sig_corrupt(err, "its header fails its checksum");
    if (hdr[7] != 1 || md_get_u32(hdr + 8) != MD_SIG_VERSION)
        return sig_corrupt(err, "its format version is not supported");
    uint32_t n = md_get_u32(hdr + 12), strong_len = md_get_u32(hdr + 16);
    uint64_t file_len = md_get_u64(hdr + 24), block_count = md_get_u64(hdr + 32);
    if (n < MD_MIN_BLOCK_LEN || n > MD_MAX_BLOCK_LEN) return sig_corrupt(err, "its block size is out of range");
    if (strong_len < 8 || strong_len > 16) return sig_corrupt(err, "its strong hash length is out of range");
    if (md_get_u32(hdr + 20) != 0) return sig_corrupt(err, "it sets unknown flags");
    if (block_count != file_len / n + (file_len % n != 0))
        return sig_corrupt(err, "its block count does not match its file length");
    if (block_count >= UINT32_MAX) return sig_corrupt(err, "it has too many blocks");
    uint64_t hsum = md_get_u64(hdr + 56);

    md_sig *sig = calloc(1, sizeof *sig);
    size_t esz = 8u + strong_len;
    frame = malloc(MD_SIG_FRAME_ENTRIES * esz + 8);
    if (!sig || !frame) {
        free(sig);
        free(frame);
        return md_fail(err, MD_E_NOMEM, "out of memory while reading a signature.");
    }
    sig->block_len = n;
    sig->strong_len = strong_len;
    sig->file_len = file_len;
    sig->block_count = block_count;
    /* Arrays grow only as entries actually arrive, so a lying header cannot make
     * us allocate more than about twice the bytes we read. */
    uint64_t cap1 = 0, cap2 = 0, cap3 = 0, done_blocks = 0, index = 0;
    while (done_blocks < block_count) {
        uint64_t cnt = block_count - done_blocks;
        if (cnt > MD_SIG_FRAME_ENTRIES) cnt = MD_SIG_FRAME_ENTRIES;
        size_t flen = (size_t)cnt * esz;
        got = md_read_full(sig_fd, frame, flen + 8);
        if (got < 0) {
            rc = md_fail_io(err, errno, "reading the signature");
            goto fail;
        }
        if ((size_t)got != flen + 8) {
            rc = sig_corrupt(err, "it is truncated");
            goto fail;
        }
        if (MD_VERIFY_CHECKSUMS &&
            md_get_u64(frame + flen) != XXH3_64bits_withSeed(frame, flen, hsum + index)) {
            rc = sig_corrupt(err, "a block frame fails its checksum");
            goto fail;
        }
        if (grow((void **)&sig->s1, 4, done_blocks + cnt, &cap1) ||
            grow((void **)&sig->s2, 4, done_blocks + cnt, &cap2) ||
            grow((void **)&sig->strong, strong_len, done_blocks + cnt, &cap3)) {
            rc = md_fail(err, MD_E_NOMEM, "out of memory while reading a signature.");
            goto fail;
        }
        for (uint64_t i = 0; i < cnt; i++) {
            const uint8_t *e = frame + i * esz;
            sig->s1[done_blocks + i] = md_get_u32(e);
            sig->s2[done_blocks + i] = md_get_u32(e + 4);
            memcpy(sig->strong + (done_blocks + i) * strong_len, e + 8, strong_len);
        }
        done_blocks += cnt;
        index++;
    }
    uint8_t trailer[25];
    got = md_read_full(sig_fd, trailer, sizeof trailer);
    if (got < 0) {
        rc = md_fail_io(err, errno, "reading the signature");
        goto fail;
    }
    if (got < 24) {
        rc = sig_corrupt(err, "it is truncated");
        goto fail;
    }
    if (got > 24) {
        rc = sig_corrupt(err, "it has bytes after its end");
        goto fail;
    }
    if (MD_VERIFY_CHECKSUMS &&
        md_get_u64(trailer + 16) != XXH3_64bits_withSeed(trailer, 16, hsum + index)) {
        rc = sig_corrupt(err, "its trailer fails its checksum");
        goto fail;
    }
    memcpy(sig->digest, trailer, 16);
    free(frame);
    *out = sig;
    return MD_OK;
fail:
    free(frame);
    md_sig_free(sig);
    return rc;
}

/* ---------------- search index ---------------- */

typedef struct sort_ctx_entry {
    uint64_t key;
    uint32_t idx;
} sort_entry;

static __thread const md_sig *t_sort_sig;

static int cmp_entry(const void *a, const void *b) {
    const sort_entry *x = a, *y = b;
    if (x->key != y->key) return x->key < y->key ? -1 : 1;
    const md_sig *s = t_sort_sig;
    int c = memcmp(s->strong + (size_t)x->idx * s->strong_len,
                   s->strong + (size_t)y->idx * s->strong_len, s->strong_len);
    if (c) return c;
    return x->idx < y->idx ? -1 : (x->idx > y->idx);
}

md_status md_sig_index(md_sig *sig, md_error *err) {
    /* Only full blocks are searched at every offset; a short tail block is
     * matched separately at the end of NEW. */
    uint64_t full = sig->file_len / sig->block_len;
    sort_entry *tmp = malloc((size_t)(full ? full : 1) * sizeof *tmp);
    if (!tmp) return md_fail(err, MD_E_NOMEM, "out of memory while indexing a signature.");
    for (uint64_t i = 0; i < full; i++) {
        tmp[i].key = md_weak_key(sig->s1[i], sig->s2[i]);
        tmp[i].idx = (uint32_t)i;
    }
    t_sort_sig = sig;
    qsort(tmp, (size_t)full, sizeof *tmp, cmp_entry);
    /* Identical blocks (runs of zeros) collapse to their first copy, so a
     * repetitive OLD never makes long chains. */
    uint64_t m = 0, distinct_keys = 0;
    for (uint64_t i = 0; i < full; i++) {
        if (m && tmp[m - 1].key == tmp[i].key &&
            memcmp(sig->strong + (size_t)tmp[m - 1].idx * sig->strong_len,
                   sig->strong + (size_t)tmp[i].idx * sig->strong_len, sig->strong_len) == 0)
            continue;
        if (!m || tmp[m - 1].key != tmp[i].key) distinct_keys++;
        tmp[m++] = tmp[i];
    }
    sig->n_sorted = m;
    sig->sorted_key = malloc((size_t)(m ? m : 1) * 8);
    sig->sorted_idx = malloc((size_t)(m ? m : 1) * 4);
    uint64_t slots = 16;
    while (slots < distinct_keys * 2) slots <<= 1;
    /* 128 bits per entry keeps the first filter's hit rate under 1% (each hit
     * costs a mispredicted branch) while the bitmap fits in 1 MiB of L2; past
     * that, 32 bits per entry as before: a bigger bitmap misses the cache anyway
     * and would only add memory. */
    uint64_t bits = 1u << 12, bits2 = 1u << 12;
    while ((bits < m * 128 && bits < ((uint64_t)1 << 23)) || (bits < m * 32 && bits < ((uint64_t)1 << 31)))
        bits <<= 1;
    while (bits2 < m * 64 && bits2 < ((uint64_t)1 << 33)) bits2 <<= 1;
    sig->filter2 = calloc((size_t)(bits2 / 64), 8);
    sig->slots = malloc((size_t)slots * 4);
    sig->bitmap = calloc((size_t)(bits / 32), 4);
    if (!sig->sorted_key || !sig->sorted_idx || !sig->slots || !sig->bitmap || !sig->filter2) {
        free(tmp);
        return md_fail(err, MD_E_NOMEM, "out of memory while indexing a signature.");
    }
    sig->slot_mask = slots - 1;
    memset(sig->slots, 0xff, (size_t)slots * 4);
    unsigned shift = 32 - log2_ceil(bits);
    sig->bitmap_shift = shift;
    unsigned shift2 = 64 - log2_ceil(bits2);
    sig->filter2_shift = shift2;
    for (uint64_t i = 0; i < m; i++) {
        sig->sorted_key[i] = tmp[i].key;
        sig->sorted_idx[i] = tmp[i].idx;
        uint64_t k = tmp[i].key;
        uint32_t bit = md_filter1((uint32_t)k, (uint32_t)(k >> 32)) >> shift;
        sig->bitmap[bit >> 5] |= (uint32_t)1 << (bit & 31);
        uint64_t bit2 = (k * MD_FILTER2_MUL) >> shift2;
        sig->filter2[bit2 >> 6] |= (uint64_t)1 << (bit2 & 63);
        if (i && tmp[i - 1].key == k) continue;
        uint64_t s = md_weak_mix(k) & sig->slot_mask;
        while (sig->slots[s] != UINT32_MAX) s = (s + 1) & sig->slot_mask;
        sig->slots[s] = (uint32_t)i;
    }
    free(tmp);
    return MD_OK;
}
