/* YAML documents with positions, diagnostics and an arena (see ydoc.h). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "schemas/ydoc.h"

/* ---- diagnostics ---- */

void sdiags_vadd(sdiags *d, const char *file, ypos at, const char *fmt, va_list ap)
{
    size_t max = d->max ? d->max : 64;
    if (d->n >= max) {
        d->dropped++;
        return;
    }
    char msg[1024], line[1400];
    vsnprintf(msg, sizeof msg, fmt, ap);
    if (at.line)
        snprintf(line, sizeof line, "%s:%u:%u: %s", file, at.line, at.col, msg);
    else
        snprintf(line, sizeof line, "%s: %s", file, msg);
    if (d->n == d->cap) {
        size_t nc = d->cap ? d->cap * 2 : 8;
        char **p = realloc(d->lines, nc * sizeof *p);
        if (!p) {
            d->oom = 1;
            d->dropped++;
            return;
        }
        d->lines = p;
        d->cap = nc;
    }
    d->lines[d->n] = strdup(line);
    if (!d->lines[d->n]) {
        d->oom = 1;
        d->dropped++;
        return;
    }
    d->n++;
}

void sdiags_add(sdiags *d, const char *file, ypos at, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    sdiags_vadd(d, file, at, fmt, ap);
    va_end(ap);
}

size_t sdiags_count(const sdiags *d)
{
    return d->n + d->dropped;
}

const char *sdiags_first(const sdiags *d)
{
    return d->n ? d->lines[0] : d->dropped ? "(error message lost: out of memory)" : "";
}

void sdiags_free(sdiags *d)
{
    for (size_t i = 0; i < d->n; i++)
        free(d->lines[i]);
    free(d->lines);
    memset(d, 0, sizeof *d);
}

/* ---- loading ---- */

static ypos mark_pos(yaml_mark_t m)
{
    return (ypos){(uint32_t)m.line + 1, (uint32_t)m.column + 1};
}

ypos ydoc_pos(const yaml_node_t *n)
{
    return n ? mark_pos(n->start_mark) : (ypos){0, 0};
}

/* A second document after the first is refused: a file is one thing. */
static int ydoc_only_one(ydoc *y, yaml_parser_t *p, sdiags *d)
{
    yaml_document_t next;
    if (!yaml_parser_load(p, &next)) {
        sdiags_add(d, y->file, mark_pos(p->problem_mark), "%s",
                   p->problem ? p->problem : "invalid YAML");
        return REFIT_ECORRUPT;
    }
    int more = yaml_document_get_root_node(&next) != NULL;
    ypos at = mark_pos(next.start_mark);
    yaml_document_delete(&next);
    if (more) {
        sdiags_add(d, y->file, at, "a second YAML document; a file holds exactly one");
        return REFIT_ECORRUPT;
    }
    return REFIT_OK;
}

/* Before the document is built, one pass over its events: refuse nesting
 * deeper than YDOC_MAX_DEPTH as soon as it is reached (libyaml's scanner
 * spends time proportional to the depth on every token, so a deep file
 * costs the square of its size if it is read whole), and scalars holding a
 * NUL ("m\0x" would read as "m" everywhere a C string is taken). REFIT_OK
 * also when the YAML is invalid: yaml_parser_load then says where. */
static int ydoc_prescan(const char *file, const char *text, size_t len, sdiags *d)
{
    yaml_parser_t p;
    if (!yaml_parser_initialize(&p))
        return REFIT_ENOMEM;
    yaml_parser_set_input_string(&p, (const unsigned char *)text, len);
    int rc = REFIT_OK, depth = 0;
    for (;;) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&p, &ev))
            break;
        yaml_event_type_t type = ev.type;
        if (type == YAML_SEQUENCE_START_EVENT || type == YAML_MAPPING_START_EVENT) {
            if (++depth > YDOC_MAX_DEPTH) {
                sdiags_add(d, file, mark_pos(ev.start_mark), "nested more than %d levels "
                           "deep (the limit on YAML nesting)", YDOC_MAX_DEPTH);
                rc = REFIT_ECORRUPT;
            }
        } else if (type == YAML_SEQUENCE_END_EVENT || type == YAML_MAPPING_END_EVENT) {
            depth--;
        } else if (type == YAML_SCALAR_EVENT &&
                   strlen((const char *)ev.data.scalar.value) != ev.data.scalar.length) {
            sdiags_add(d, file, mark_pos(ev.start_mark), "a NUL character inside a scalar; "
                       "names and values are text without NUL");
            rc = REFIT_ECORRUPT;
        }
        yaml_event_delete(&ev);
        if (rc || type == YAML_STREAM_END_EVENT)
            break;
    }
    yaml_parser_delete(&p);
    return rc;
}

int ydoc_load_mem(ydoc *y, const char *name, const char *text, size_t len, sdiags *d)
{
    memset(y, 0, sizeof *y);
    y->file = strdup(name ? name : "<memory>");
    if (!y->file)
        return REFIT_ENOMEM;
    int rc = ydoc_prescan(y->file, text, len, d);
    if (rc)
        return rc;
    yaml_parser_t p;
    if (!yaml_parser_initialize(&p))
        return REFIT_ENOMEM;
    yaml_parser_set_input_string(&p, (const unsigned char *)text, len);
    if (!yaml_parser_load(&p, &y->doc)) {
        ypos at = mark_pos(p.problem_mark);
        if (p.context && p.problem_mark.line == 0 && p.problem_mark.column == 0)
            at = mark_pos(p.context_mark);
        sdiags_add(d, y->file, at, "%s%s%s", p.problem ? p.problem : "invalid YAML",
                   p.context ? " " : "", p.context ? p.context : "");
        rc = p.error == YAML_MEMORY_ERROR ? REFIT_ENOMEM : REFIT_ECORRUPT;
    } else {
        y->loaded = 1;
        if (!yaml_document_get_root_node(&y->doc)) {
            sdiags_add(d, y->file, (ypos){1, 1}, "the document is empty");
            rc = REFIT_ECORRUPT;
        } else {
            rc = ydoc_only_one(y, &p, d);
        }
    }
    yaml_parser_delete(&p);
    return rc;
}

static int read_all(const char *path, char **out, size_t *len, sdiags *d)
{
    /* O_NONBLOCK: a FIFO in the file's place must not block the open; what
     * is not a regular file is refused before a byte is read */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        sdiags_add(d, path, (ypos){0, 0}, "cannot read: %s", strerror(errno));
        return REFIT_EIO;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        sdiags_add(d, path, (ypos){0, 0}, "cannot read: not a regular file");
        close(fd);
        return REFIT_EIO;
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        sdiags_add(d, path, (ypos){0, 0}, "cannot read: %s", strerror(errno));
        close(fd);
        return REFIT_EIO;
    }
    if ((uint64_t)st.st_size > YDOC_MAX_BYTES) {
        sdiags_add(d, path, (ypos){0, 0}, "%lld bytes; YAML files above %u MiB are refused",
                   (long long)st.st_size, YDOC_MAX_BYTES >> 20);
        fclose(f);
        return REFIT_ECORRUPT;
    }
    char *buf = malloc((size_t)st.st_size + 1);
    if (!buf) {
        fclose(f);
        return REFIT_ENOMEM;
    }
    size_t got = fread(buf, 1, (size_t)st.st_size, f);
    int err = ferror(f);
    fclose(f);
    if (err || got != (size_t)st.st_size) {
        free(buf);
        sdiags_add(d, path, (ypos){0, 0}, "cannot read: short read");
        return REFIT_EIO;
    }
    buf[got] = '\0';
    *out = buf;
    *len = got;
    return REFIT_OK;
}

int ydoc_load_file(ydoc *y, const char *path, sdiags *d)
{
    memset(y, 0, sizeof *y);
    char *buf = NULL;
    size_t len = 0;
    int rc = read_all(path, &buf, &len, d);
    if (rc)
        return rc;
    rc = ydoc_load_mem(y, path, buf, len, d);
    free(buf);
    return rc;
}

void ydoc_free(ydoc *y)
{
    if (y->loaded)
        yaml_document_delete(&y->doc);
    free(y->file);
    memset(y, 0, sizeof *y);
}

/* ---- nodes ---- */

yaml_node_t *ydoc_root(ydoc *y)
{
    return y->loaded ? yaml_document_get_root_node(&y->doc) : NULL;
}

yaml_node_t *ydoc_node(ydoc *y, int id)
{
    return yaml_document_get_node(&y->doc, id);
}

yaml_node_t *ydoc_key(ydoc *y, const yaml_node_t *map, const char *key)
{
    if (!map || map->type != YAML_MAPPING_NODE)
        return NULL;
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top;
         p++) {
        yaml_node_t *k = ydoc_node(y, p->key);
        const char *s = ydoc_str(k);
        if (s && !strcmp(s, key))
            return k;
    }
    return NULL;
}

yaml_node_t *ydoc_get(ydoc *y, const yaml_node_t *map, const char *key)
{
    if (!map || map->type != YAML_MAPPING_NODE)
        return NULL;
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top;
         p++) {
        const char *s = ydoc_str(ydoc_node(y, p->key));
        if (s && !strcmp(s, key))
            return ydoc_node(y, p->value);
    }
    return NULL;
}

const char *ydoc_str(const yaml_node_t *n)
{
    return n && n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value : NULL;
}

static int is_plain(const yaml_node_t *n)
{
    return n && n->type == YAML_SCALAR_NODE && n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
}

int ydoc_parse_int(const char *s, int64_t *out)
{
    if (!s || !*s)
        return 0;
    const char *p = s;
    int neg = 0;
    if (*p == '-' || *p == '+')
        neg = *p++ == '-';
    if (!*p)
        return 0;
    uint64_t v = 0;
    for (; *p; p++) {
        if (*p < '0' || *p > '9')
            return 0;
        unsigned dig = (unsigned)(*p - '0');
        if (v > (UINT64_C(9223372036854775808) - dig) / 10)
            return 0;
        v = v * 10 + dig;
    }
    if (!neg && v > INT64_MAX)
        return 0;
    if (neg)
        *out = v == UINT64_C(9223372036854775808) ? INT64_MIN : -(int64_t)v;
    else
        *out = (int64_t)v;
    return 1;
}

int ydoc_int(const yaml_node_t *n, int64_t *out)
{
    return is_plain(n) && ydoc_parse_int(ydoc_str(n), out);
}

int ydoc_bool(const yaml_node_t *n, int *out)
{
    if (!is_plain(n))
        return 0;
    const char *s = ydoc_str(n);
    if (!strcasecmp(s, "true"))
        *out = 1;
    else if (!strcasecmp(s, "false"))
        *out = 0;
    else
        return 0;
    return 1;
}

const char *ydoc_kind_name(const yaml_node_t *n)
{
    if (!n)
        return "nothing";
    switch (n->type) {
    case YAML_MAPPING_NODE:
        return "a mapping";
    case YAML_SEQUENCE_NODE:
        return "a list";
    case YAML_SCALAR_NODE:
        return n->data.scalar.length == 0 && n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE
                   ? "an empty value"
                   : "a scalar";
    default:
        return "nothing";
    }
}

int ydoc_dtype(const char *name, refit_dtype *out)
{
    static const refit_dtype all[] = {
        {REFIT_DTYPE_FLOAT, 64, 1}, {REFIT_DTYPE_FLOAT, 32, 1}, {REFIT_DTYPE_FLOAT, 16, 1},
        {REFIT_DTYPE_BFLOAT, 16, 1}, {REFIT_DTYPE_INT, 8, 1}, {REFIT_DTYPE_INT, 16, 1},
        {REFIT_DTYPE_INT, 32, 1}, {REFIT_DTYPE_INT, 64, 1}, {REFIT_DTYPE_UINT, 8, 1},
        {REFIT_DTYPE_UINT, 16, 1}, {REFIT_DTYPE_UINT, 32, 1}, {REFIT_DTYPE_UINT, 64, 1},
        {REFIT_DTYPE_BOOL, 8, 1}, {REFIT_DTYPE_FLOAT8_E4M3FN, 8, 1},
        {REFIT_DTYPE_FLOAT8_E5M2, 8, 1}, {REFIT_DTYPE_FLOAT8_E8M0FNU, 8, 1},
        {REFIT_DTYPE_FLOAT4_E2M1FN, 4, 1},
    };
    for (size_t i = 0; name && i < sizeof all / sizeof all[0]; i++)
        if (!strcmp(refit_dtype_name(all[i]), name)) {
            *out = all[i];
            return 1;
        }
    return 0;
}

/* Optimal string alignment distance (a swap of neighbours costs 1, so
 * "bf61" is nearer "bf16" than "f64"), stopped early past cap. */
size_t ydoc_distance(const char *a, const char *b, size_t cap)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63)
        return cap + 1;
    size_t prev2[64], prev[64], cur[64];
    for (size_t j = 0; j <= lb; j++)
        prev[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t best = cur[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t v = prev[j - 1] + (a[i - 1] != b[j - 1]);
            if (prev[j] + 1 < v)
                v = prev[j] + 1;
            if (cur[j - 1] + 1 < v)
                v = cur[j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                prev2[j - 2] + 1 < v)
                v = prev2[j - 2] + 1;
            cur[j] = v;
            if (v < best)
                best = v;
        }
        if (best > cap)
            return cap + 1;
        memcpy(prev2, prev, sizeof prev);
        memcpy(prev, cur, sizeof cur);
    }
    return prev[lb];
}

/* ---- arena ---- */

struct yarena_block {
    struct yarena_block *next;
    size_t used, size;
    max_align_t data[];
};

void *yarena_alloc(yarena *a, size_t n)
{
    const size_t al = sizeof(max_align_t);
    if (n > SIZE_MAX - al)
        return NULL;
    n = (n + al - 1) / al * al;
    struct yarena_block *b = a->head;
    if (!b || b->size - b->used < n) {
        size_t size = n > 16384 ? n : 16384;
        b = malloc(sizeof *b + size);
        if (!b)
            return NULL;
        b->next = a->head;
        b->used = 0;
        b->size = size;
        a->head = b;
    }
    void *p = (char *)b->data + b->used;
    b->used += n;
    memset(p, 0, n);
    return p;
}

char *yarena_strdup(yarena *a, const char *s)
{
    if (!s)
        return NULL;
    size_t n = strlen(s) + 1;
    char *p = yarena_alloc(a, n);
    if (p)
        memcpy(p, s, n);
    return p;
}

int yarena_grow(yarena *a, void **arr, size_t *cap, size_t n, size_t es)
{
    if (n < *cap)
        return REFIT_OK;
    size_t nc = *cap ? *cap * 2 : 1; /* a module with one entry holds one */
    if (nc > SIZE_MAX / es)
        return REFIT_ENOMEM;
    void *p = yarena_alloc(a, nc * es);
    if (!p)
        return REFIT_ENOMEM;
    if (n)
        memcpy(p, *arr, n * es);
    *arr = p;
    *cap = nc;
    return REFIT_OK;
}

void yarena_free(yarena *a)
{
    while (a->head) {
        struct yarena_block *n = a->head->next;
        free(a->head);
        a->head = n;
    }
}
