/* service/config_text.c: HeapprofdConfig in protobuf text format (service/config.h).
 *
 * The accepted language is the subset of protobuf text format a HeapprofdConfig needs:
 *   field: value          scalars (integers, true/false, "quoted strings")
 *   field { ... }         nested messages (also `field: { ... }`)
 *   # comment             to the end of the line
 * Separators `,` and `;` after a field are allowed. Repeated fields repeat the field. */
#include "service/config.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_CONFIG_BYTES (1u << 20)
#define MAX_STRING 4096

enum tok_type {
    TOK_EOF,
    TOK_IDENT,
    TOK_INT,
    TOK_STRING,
    TOK_COLON,
    TOK_LBRACE,
    TOK_RBRACE,
    TOK_SEP,
    TOK_ERROR
};

struct parser {
    const char *p, *end;
    const char *file;
    unsigned line;
    char *err;
    size_t err_len;
    /* current token */
    enum tok_type t;
    unsigned tline;
    char text[MAX_STRING + 1];
    size_t text_len;
};

static int fail(struct parser *ps, unsigned line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(struct parser *ps, unsigned line, const char *fmt, ...)
{
    int n = snprintf(ps->err, ps->err_len, "%s:%u: ", ps->file, line);
    if (n < 0 || (size_t)n >= ps->err_len)
        return -EINVAL;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ps->err + n, ps->err_len - (size_t)n, fmt, ap);
    va_end(ap);
    return -EINVAL;
}

static int next(struct parser *ps)
{
    for (;;) {
        while (ps->p < ps->end && isspace((unsigned char)*ps->p)) {
            if (*ps->p == '\n')
                ps->line++;
            ps->p++;
        }
        if (ps->p < ps->end && *ps->p == '#') {
            while (ps->p < ps->end && *ps->p != '\n')
                ps->p++;
            continue;
        }
        break;
    }
    ps->tline = ps->line;
    ps->text_len = 0;
    ps->text[0] = '\0';
    if (ps->p >= ps->end) {
        ps->t = TOK_EOF;
        return 0;
    }
    char c = *ps->p;
    if (c == ':' || c == '{' || c == '}' || c == ',' || c == ';') {
        ps->p++;
        ps->t = c == ':' ? TOK_COLON : c == '{' ? TOK_LBRACE : c == '}' ? TOK_RBRACE : TOK_SEP;
        return 0;
    }
    if (c == '"' || c == '\'') {
        char q = c;
        ps->p++;
        while (ps->p < ps->end && *ps->p != q) {
            char ch = *ps->p++;
            if (ch == '\n')
                return fail(ps, ps->tline, "unterminated string");
            if (ch == '\\') {
                if (ps->p >= ps->end)
                    break;
                char e = *ps->p++;
                switch (e) {
                case 'n':
                    ch = '\n';
                    break;
                case 't':
                    ch = '\t';
                    break;
                case '\\':
                case '"':
                case '\'':
                    ch = e;
                    break;
                default:
                    return fail(ps, ps->tline, "unsupported escape '\\%c' in string", e);
                }
            }
            if (ps->text_len >= MAX_STRING)
                return fail(ps, ps->tline, "string longer than %u bytes", MAX_STRING);
            ps->text[ps->text_len++] = ch;
        }
        if (ps->p >= ps->end)
            return fail(ps, ps->tline, "unterminated string");
        ps->p++;
        ps->text[ps->text_len] = '\0';
        if (memchr(ps->text, '\0', ps->text_len))
            return fail(ps, ps->tline, "NUL byte in string");
        ps->t = TOK_STRING;
        return 0;
    }
    if (isalnum((unsigned char)c) || c == '_' || c == '-' || c == '+') {
        while (ps->p < ps->end && (isalnum((unsigned char)*ps->p) || *ps->p == '_' ||
                                   *ps->p == '-' || *ps->p == '+' || *ps->p == '.')) {
            if (ps->text_len >= 256)
                return fail(ps, ps->tline, "token too long");
            ps->text[ps->text_len++] = *ps->p++;
        }
        ps->text[ps->text_len] = '\0';
        ps->t = isalpha((unsigned char)c) || c == '_' ? TOK_IDENT : TOK_INT;
        return 0;
    }
    return fail(ps, ps->tline, "unexpected character '%c'", isprint((unsigned char)c) ? c : '?');
}

static int expect_value(struct parser *ps, const char *field)
{
    int r = next(ps);
    if (r < 0)
        return r;
    if (ps->t != TOK_COLON)
        return fail(ps, ps->tline, "expected ':' after '%s'", field);
    r = next(ps);
    if (r < 0)
        return r;
    if (ps->t != TOK_INT && ps->t != TOK_IDENT && ps->t != TOK_STRING)
        return fail(ps, ps->tline, "missing value for '%s'", field);
    return 0;
}

/* A number in the syntax of protobuf text format's integers we accept: decimal, or
 * hexadecimal with 0x. */
static int get_uint(struct parser *ps, const struct svc_config_field *f, uint64_t *ret)
{
    int r = expect_value(ps, f->name);
    if (r < 0)
        return r;
    if (ps->t != TOK_INT)
        return fail(ps, ps->tline, "'%s' wants a number, not '%s'", f->name, ps->text);
    const char *t = ps->text;
    uint64_t v = 0;
    if (t[0] == '0' && (t[1] == 'x' || t[1] == 'X')) {
        char *endp;
        errno = 0;
        v = strtoull(t + 2, &endp, 16);
        if (errno || *endp || !isxdigit((unsigned char)t[2]))
            r = -EINVAL;
    } else {
        r = svc_parse_uint(t, false, &v);
    }
    if (r < 0)
        return fail(ps, ps->tline, "invalid value '%s' for '%s' (%llu..%llu)", t, f->name,
                    (unsigned long long)f->min, (unsigned long long)f->max);
    if (v == 0 && (f->flags & SVC_FIELD_NONZERO))
        return fail(ps, ps->tline, "%s must be %s", f->name,
                    f->type == SVC_FIELD_PIDS ? "positive" : "at least 1");
    *ret = v;
    return 0;
}

static int get_bool(struct parser *ps, const char *field, bool *ret)
{
    int r = expect_value(ps, field);
    if (r < 0)
        return r;
    if (!strcmp(ps->text, "true") || !strcmp(ps->text, "1"))
        *ret = true;
    else if (!strcmp(ps->text, "false") || !strcmp(ps->text, "0"))
        *ret = false;
    else
        return fail(ps, ps->tline, "'%s' wants true or false, not '%s'", field, ps->text);
    return 0;
}

static int get_string(struct parser *ps, const char *field)
{
    int r = expect_value(ps, field);
    if (r < 0)
        return r;
    if (ps->t != TOK_STRING)
        return fail(ps, ps->tline, "'%s' wants a quoted string", field);
    return 0;
}

static int parse_message(struct parser *ps, struct svc_config *cfg, bool nested_dump);

static int parse_nested(struct parser *ps, struct svc_config *cfg, const char *field)
{
    int r = next(ps);
    if (r < 0)
        return r;
    if (ps->t == TOK_COLON && (r = next(ps)) < 0)
        return r;
    if (ps->t != TOK_LBRACE)
        return fail(ps, ps->tline, "expected '{' after '%s'", field);
    unsigned open_line = ps->tline;
    r = parse_message(ps, cfg, true);
    if (r < 0)
        return r;
    if (ps->t != TOK_RBRACE)
        return fail(ps, open_line, "'%s {' is not closed", field);
    return 0;
}

/* One field's value, of the type the table gives it. */
static int parse_value(struct parser *ps, struct svc_config *cfg, const struct svc_config_field *f)
{
    char msg[256];
    uint64_t v = 0;
    bool b = false;
    int r;
    switch (f->type) {
    case SVC_FIELD_BOOL:
    case SVC_FIELD_ACCEPTED:
        if ((r = get_bool(ps, f->name, &b)) < 0)
            return r;
        svc_config_set_bool(cfg, f, b);
        return 0;
    case SVC_FIELD_UINT:
    case SVC_FIELD_BYTES:
    case SVC_FIELD_PIDS:
        if ((r = get_uint(ps, f, &v)) < 0)
            return r;
        r = svc_config_set_uint(cfg, f, v, msg, sizeof(msg));
        break;
    case SVC_FIELD_CMDLINES:
    case SVC_FIELD_HEAPS:
        if ((r = get_string(ps, f->name)) < 0)
            return r;
        r = svc_config_set_string(cfg, f, ps->text, msg, sizeof(msg));
        break;
    default:
        return fail(ps, ps->tline, "unknown field '%s'", f->name);
    }
    return r < 0 ? fail(ps, ps->tline, "%s", msg) : 0;
}

/* Parses fields until '}' (nested) or EOF (top level). */
static int parse_message(struct parser *ps, struct svc_config *cfg, bool nested_dump)
{
    int r;
    for (;;) {
        if ((r = next(ps)) < 0)
            return r;
        if (ps->t == TOK_SEP)
            continue;
        if (ps->t == TOK_EOF) {
            if (nested_dump)
                return fail(ps, ps->tline, "unexpected end of file inside '{'");
            return 0;
        }
        if (ps->t == TOK_RBRACE) {
            if (!nested_dump)
                return fail(ps, ps->tline, "unexpected '}'");
            return 0;
        }
        if (ps->t != TOK_IDENT)
            return fail(ps, ps->tline, "expected a field name, not '%s'", ps->text);
        char f[64], qualified[96];
        unsigned fline = ps->tline;
        if (ps->text_len >= sizeof(f))
            return fail(ps, fline, "unknown field '%.40s...'", ps->text);
        memcpy(f, ps->text, ps->text_len + 1);

        if (!nested_dump && !strcmp(f, "continuous_dump_config")) {
            if ((r = parse_nested(ps, cfg, f)) < 0)
                return r;
            continue;
        }
        snprintf(qualified, sizeof(qualified), "%s%s", nested_dump ? "continuous_dump_config." : "",
                 f);
        const struct svc_config_field *field = svc_config_field_find(qualified);
        if (!field) {
            if (nested_dump)
                return fail(ps, fline, "unknown field '%s' in continuous_dump_config", f);
            return fail(ps, fline, "unknown field '%s'", f);
        }
        if ((r = parse_value(ps, cfg, field)) < 0)
            return r;
    }
}

int svc_config_parse_text(const char *text, size_t len, const char *filename,
                          struct svc_config *cfg, char *err, size_t err_len)
{
    struct parser *ps = calloc(1, sizeof(*ps));
    if (!ps)
        return -ENOMEM;
    ps->p = text;
    ps->end = text + len;
    ps->file = filename ? filename : "<config>";
    ps->line = 1;
    ps->err = err;
    ps->err_len = err_len;
    if (err_len)
        err[0] = '\0';
    int r = parse_message(ps, cfg, false);
    free(ps);
    return r;
}

int svc_config_load_file(const char *path, struct svc_config *cfg, char *err, size_t err_len)
{
    HP_CLEANUP_CLOSE int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        snprintf(err, err_len, "%s: %s", path, strerror(e));
        return -e;
    }
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size > MAX_CONFIG_BYTES) {
        snprintf(err, err_len, "%s: not a regular file of at most 1 MiB", path);
        return -EINVAL;
    }
    HP_CLEANUP_FREE char *buf = malloc((size_t)st.st_size + 1);
    if (!buf)
        return -ENOMEM;
    size_t len = 0;
    while (len < (size_t)st.st_size) {
        ssize_t n = read(fd, buf + len, (size_t)st.st_size - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        len += (size_t)n;
    }
    return svc_config_parse_text(buf, len, path, cfg, err, err_len);
}
