/* A hardened reader of safetensors headers, for the numeric model of md_delta_basis:
 * an 8-byte little-endian length N, then N bytes of JSON mapping each tensor's name
 * to {"dtype", "shape", "data_offsets": [begin, end]} (offsets into the bytes after
 * the header), plus an optional "__metadata__" object.
 *
 * The file is hostile until proven otherwise: N is bounded by the file and by
 * safetensors' own 100 MB limit before anything is allocated; the parser is a
 * strict recursive-descent reader with a depth limit that never reads past the
 * buffer; every tensor must lie inside the data, have exactly
 * product(shape) * element size bytes, not overlap another, and have a unique
 * name. Any failure means "not a safetensors file": the caller then diffs the
 * file without the model, so a bad header costs compression, never safety. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "md_internal.h"

#define ST_MAX_HEADER ((uint64_t)100000000)
#define ST_MAX_DEPTH 64

typedef struct jp {
    const uint8_t *p, *end;
} jp;

static void ws(jp *j) {
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r')) j->p++;
}

static int lit(jp *j, char c) {
    ws(j);
    if (j->p < j->end && *j->p == (uint8_t)c) {
        j->p++;
        return 1;
    }
    return 0;
}

static int hex(uint8_t c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* A JSON string; *s and *n get its raw bytes between the quotes (escapes kept). */
static int str(jp *j, const uint8_t **s, size_t *n) {
    ws(j);
    if (j->p >= j->end || *j->p != '"') return 0;
    const uint8_t *start = ++j->p;
    while (j->p < j->end) {
        uint8_t c = *j->p;
        if (c == '"') {
            if (s) *s = start;
            if (n) *n = (size_t)(j->p - start);
            j->p++;
            return 1;
        }
        if (c < 0x20) return 0;
        if (c == '\\') {
            if (j->end - j->p < 2) return 0;
            uint8_t e = j->p[1];
            if (e == 'u') {
                if (j->end - j->p < 6 || !hex(j->p[2]) || !hex(j->p[3]) || !hex(j->p[4]) || !hex(j->p[5]))
                    return 0;
                j->p += 6;
                continue;
            }
            if (!strchr("\"\\/bfnrt", e) || e == 0) return 0;
            j->p += 2;
            continue;
        }
        j->p++;
    }
    return 0;
}

static int str_is(const uint8_t *s, size_t n, const char *want) {
    return n == strlen(want) && memcmp(s, want, n) == 0;
}

/* A non-negative integer without sign, fraction or exponent, below 2^63. */
static int number(jp *j, uint64_t *out) {
    ws(j);
    uint64_t v = 0;
    const uint8_t *start = j->p;
    while (j->p < j->end && *j->p >= '0' && *j->p <= '9') {
        if (v > (UINT64_MAX >> 1) / 10) return 0;
        v = v * 10 + (uint64_t)(*j->p - '0');
        j->p++;
    }
    if (j->p == start || (j->p < j->end && (*j->p == '.' || *j->p == 'e' || *j->p == 'E'))) return 0;
    if (j->p - start > 1 && *start == '0') return 0;
    *out = v;
    return 1;
}

static int skip_value(jp *j, int depth);

static int skip_number(jp *j) {
    const uint8_t *start = j->p;
    if (j->p < j->end && *j->p == '-') j->p++;
    while (j->p < j->end && ((*j->p >= '0' && *j->p <= '9') || *j->p == '.' || *j->p == 'e' ||
                             *j->p == 'E' || *j->p == '+' || *j->p == '-'))
        j->p++;
    return j->p > start;
}

static int word(jp *j, const char *w) {
    size_t n = strlen(w);
    if ((size_t)(j->end - j->p) < n || memcmp(j->p, w, n) != 0) return 0;
    j->p += n;
    return 1;
}

static int skip_value(jp *j, int depth) {
    if (depth > ST_MAX_DEPTH) return 0;
    ws(j);
    if (j->p >= j->end) return 0;
    uint8_t c = *j->p;
    if (c == '"') return str(j, NULL, NULL);
    if (c == '{') {
        j->p++;
        if (lit(j, '}')) return 1;
        do {
            if (!str(j, NULL, NULL) || !lit(j, ':') || !skip_value(j, depth + 1)) return 0;
        } while (lit(j, ','));
        return lit(j, '}');
    }
    if (c == '[') {
        j->p++;
        if (lit(j, ']')) return 1;
        do {
            if (!skip_value(j, depth + 1)) return 0;
        } while (lit(j, ','));
        return lit(j, ']');
    }
    if (c == 't') return word(j, "true");
    if (c == 'f') return word(j, "false");
    if (c == 'n') return word(j, "null");
    return skip_number(j);
}

static uint32_t dtype_width(const uint8_t *s, size_t n) {
    static const struct {
        const char *name;
        uint32_t width;
    } table[] = {{"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4},
                 {"I16", 2}, {"I8", 1},  {"U64", 8}, {"U32", 4},  {"U16", 2}, {"U8", 1},
                 {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (str_is(s, n, table[i].name)) return table[i].width;
    return 0;
}

/* One tensor's object. */
static int tensor(jp *j, md_tensor *t, uint64_t data_len, uint64_t data_start) {
    int have_dtype = 0, have_shape = 0, have_off = 0;
    uint64_t elems = 1, a = 0, b = 0;
    uint32_t width = 0;
    if (!lit(j, '{')) return 0;
    if (lit(j, '}')) return 0;
    do {
        const uint8_t *k;
        size_t kn;
        if (!str(j, &k, &kn) || !lit(j, ':')) return 0;
        if (str_is(k, kn, "dtype")) {
            const uint8_t *v;
            size_t vn;
            if (have_dtype++ || !str(j, &v, &vn)) return 0;
            width = dtype_width(v, vn);
        } else if (str_is(k, kn, "shape")) {
            if (have_shape++ || !lit(j, '[')) return 0;
            if (!lit(j, ']')) {
                do {
                    uint64_t d;
                    if (!number(j, &d)) return 0;
                    if (d && elems > (UINT64_MAX >> 4) / d) return 0; /* absurd sizes */
                    elems *= d;
                } while (lit(j, ','));
                if (!lit(j, ']')) return 0;
            }
        } else if (str_is(k, kn, "data_offsets")) {
            if (have_off++ || !lit(j, '[') || !number(j, &a) || !lit(j, ',') || !number(j, &b) || !lit(j, ']'))
                return 0;
        } else if (!skip_value(j, 2)) {
            return 0;
        }
    } while (lit(j, ','));
    if (!lit(j, '}') || !have_dtype || !have_shape || !have_off) return 0;
    if (a > b || b > data_len) return 0;
    if (width && elems * width != b - a) return 0;
    t->width = width;
    t->off = data_start + a;
    t->len = b - a;
    return 1;
}

static int by_offset(const void *x, const void *y) {
    const md_tensor *a = x, *b = y;
    if (a->off != b->off) return a->off < b->off ? -1 : 1;
    return a->len < b->len ? -1 : a->len > b->len;
}

static int by_name(const void *x, const void *y) {
    const md_tensor *a = x, *b = y;
    uint32_t n = a->name_len < b->name_len ? a->name_len : b->name_len;
    int c = memcmp(a->name, b->name, n);
    if (c) return c;
    return a->name_len < b->name_len ? -1 : a->name_len > b->name_len;
}

void md_st_free(md_st *st) {
    free(st->header);
    free(st->t);
    memset(st, 0, sizeof *st);
}

/* Parses st->header (n JSON bytes); 1 if valid. */
static int parse_json(md_st *st, size_t n, uint64_t file_len) {
    jp j = {st->header, st->header + n};
    size_t cap = 0;
    uint64_t data_len = file_len - st->data_start;
    ws(&j);
    if (j.p >= j.end || *j.p != '{') return 0;
    j.p++;
    if (!lit(&j, '}')) {
        do {
            const uint8_t *k;
            size_t kn;
            if (!str(&j, &k, &kn) || !lit(&j, ':')) return 0;
            if (str_is(k, kn, "__metadata__")) {
                if (!skip_value(&j, 1)) return 0;
                continue;
            }
            if (st->n == cap) {
                size_t nc = cap ? cap * 2 : 64;
                md_tensor *nt = realloc(st->t, nc * sizeof *nt);
                if (!nt) return -1;
                st->t = nt;
                cap = nc;
            }
            md_tensor *t = &st->t[st->n];
            t->name = (const char *)k;
            t->name_len = (uint32_t)kn;
            if (kn > UINT32_MAX || !tensor(&j, t, data_len, st->data_start)) return 0;
            st->n++;
        } while (lit(&j, ','));
        if (!lit(&j, '}')) return 0;
    }
    ws(&j);
    if (j.p != j.end) return 0; /* only whitespace may pad the header */
    if (st->n > 1) {
        qsort(st->t, st->n, sizeof *st->t, by_name);
        for (size_t i = 1; i < st->n; i++)
            if (by_name(&st->t[i - 1], &st->t[i]) == 0) return 0; /* a name used twice */
        qsort(st->t, st->n, sizeof *st->t, by_offset);
        for (size_t i = 1; i < st->n; i++)
            if (st->t[i - 1].off + st->t[i - 1].len > st->t[i].off) return 0; /* overlap */
    }
    return 1;
}

static int finish(md_st *st, size_t n, uint64_t file_len) {
    int rc = parse_json(st, n, file_len);
    if (rc != 1) md_st_free(st);
    return rc;
}

int md_st_parse_mem(const uint8_t *p, size_t n, uint64_t file_len, md_st *st) {
    memset(st, 0, sizeof *st);
    if (n < 8 || file_len < n) return 0;
    uint64_t hl = md_get_u64(p);
    if (hl < 2 || hl > ST_MAX_HEADER || hl > file_len - 8 || hl > n - 8 || p[8] != '{') return 0;
    st->header = malloc((size_t)hl);
    if (!st->header) return -1;
    memcpy(st->header, p + 8, (size_t)hl);
    st->data_start = 8 + hl;
    return finish(st, (size_t)hl, file_len);
}

int md_st_parse(int fd, uint64_t file_len, md_st *st) {
    uint8_t head[9];
    memset(st, 0, sizeof *st);
    if (file_len < 10) return 0;
    int64_t got = md_pread_full(fd, head, sizeof head, 0);
    if (got < 0) return -1;
    if (got != (int64_t)sizeof head) return 0;
    uint64_t hl = md_get_u64(head);
    /* Bounded by the file and by safetensors' own limit before any allocation. */
    if (hl < 2 || hl > ST_MAX_HEADER || hl > file_len - 8 || head[8] != '{') return 0;
    st->header = malloc((size_t)hl);
    if (!st->header) return -1;
    got = md_pread_full(fd, st->header, (size_t)hl, 8);
    if (got != (int64_t)hl) {
        md_st_free(st);
        return got < 0 ? -1 : 0;
    }
    st->data_start = 8 + hl;
    return finish(st, (size_t)hl, file_len);
}
