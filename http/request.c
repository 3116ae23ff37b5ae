/* http/request.c: the request head parser and the query string reader (http/request.h).
 * The head is parsed from its start each time more bytes arrive: at most HTTP_MAX_HEAD
 * bytes, a few microseconds, and no state to keep between reads. */
#include "http/request.h"

#include <string.h>

#include "common/macros.h"

/* RFC 9110 token characters (methods, header names). */
static bool is_tchar(unsigned char c)
{
    if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
        return true;
    return c && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

/* Visible ASCII: the characters of a request target. */
static bool is_vchar(unsigned char c)
{
    return c > 0x20 && c < 0x7f;
}

/* A header value's characters: visible, obs-text, space and tab. */
static bool is_field_char(unsigned char c)
{
    return is_vchar(c) || c >= 0x80 || c == ' ' || c == '\t';
}

static int bad(struct http_request *ret, int status, const char *why)
{
    ret->why_bad = why;
    return -status;
}

/* The method so far of a request line not ended yet: a run of token characters, then
 * possibly a space and more. 0 while that holds, else -400. */
static int check_partial(const char *l, size_t n, struct http_request *ret)
{
    size_t i = 0;
    while (i < n && is_tchar((unsigned char)l[i]))
        i++;
    if (i < n && (l[i] != ' ' || i == 0))
        return bad(ret, 400, "the request line does not start with a method");
    return 0;
}

static int parse_version(const char *v, size_t n, struct http_request *ret)
{
    if (n != 8 || memcmp(v, "HTTP/", 5) != 0 || v[6] != '.' || v[5] < '0' || v[5] > '9' ||
        v[7] < '0' || v[7] > '9')
        return bad(ret, 400, "the request line does not end with HTTP/1.0 or HTTP/1.1");
    if (v[5] != '1')
        return bad(ret, 505, "only HTTP/1.0 and HTTP/1.1 are served");
    ret->minor_version = v[7] - '0';
    return 0;
}

/* `METHOD SP target SP HTTP/1.x`: 0 or -status. */
static int parse_request_line(const char *l, size_t n, struct http_request *ret)
{
    size_t m = 0;
    while (m < n && is_tchar((unsigned char)l[m]))
        m++;
    if (m == 0 || m >= n || l[m] != ' ')
        return bad(ret, 400, "the request line does not start with a method");
    if (m == 3 && memcmp(l, "GET", 3) == 0)
        ret->method = HTTP_METHOD_GET;
    else if (m == 4 && memcmp(l, "HEAD", 4) == 0)
        ret->method = HTTP_METHOD_HEAD;
    else
        ret->method = HTTP_METHOD_OTHER;
    size_t t = m + 1, te = t;
    while (te < n && is_vchar((unsigned char)l[te]) && l[te] != '#')
        te++;
    if (te == t || te >= n || l[te] != ' ')
        return bad(ret, 400, "the request target is missing or holds a character not allowed");
    if (l[t] != '/')
        return bad(ret, 400, "the request target is not a path ('/path?query')");
    int r = parse_version(l + te + 1, n - te - 1, ret);
    if (r < 0)
        return r;
    const char *q = memchr(l + t, '?', te - t);
    ret->path = l + t;
    ret->path_len = (size_t)((q ? q : l + te) - (l + t));
    ret->query = q ? q + 1 : "";
    ret->query_len = q ? (size_t)(l + te - q - 1) : 0;
    return 0;
}

/* `name: value`: 0 or -400. */
static int parse_header(const char *l, size_t n, struct http_request *ret)
{
    size_t i = 0;
    while (i < n && is_tchar((unsigned char)l[i]))
        i++;
    if (i == 0 || i >= n || l[i] != ':')
        return bad(ret, 400, "a header line is not 'name: value'");
    for (i++; i < n; i++)
        if (!is_field_char((unsigned char)l[i]))
            return bad(ret, 400, "a header value holds a control character");
    return 0;
}

int http_parse_request(const char *buf, size_t len, struct http_request *ret)
{
    memset(ret, 0, sizeof(*ret));
    const size_t lim = len < HTTP_MAX_HEAD ? len : HTTP_MAX_HEAD;
    size_t pos = 0, headers = 0;
    bool have_request_line = false;
    for (;;) {
        const char *nl = memchr(buf + pos, '\n', lim - pos);
        if (!nl) {
            if (len >= HTTP_MAX_HEAD)
                return bad(ret, 431, "the request head is longer than 8 KiB");
            return have_request_line ? 0 : check_partial(buf + pos, lim - pos, ret);
        }
        size_t end = (size_t)(nl - buf), n = end - pos;
        if (n > 0 && buf[end - 1] == '\r')
            n--;
        const char *l = buf + pos;
        pos = end + 1;
        int r = 0;
        if (!have_request_line) {
            /* Empty lines before the request line are skipped (RFC 9112, 2.2). */
            if (n == 0)
                continue;
            r = parse_request_line(l, n, ret);
            have_request_line = true;
        } else if (n == 0) {
            ret->head_len = pos;
            return (int)pos;
        } else if (l[0] == ' ' || l[0] == '\t') {
            r = bad(ret, 400, "folded header lines are not accepted");
        } else if (++headers > HTTP_MAX_HEADERS) {
            r = bad(ret, 431, "more than 100 header lines");
        } else {
            r = parse_header(l, n, ret);
        }
        if (r < 0)
            return r;
    }
}

/* Percent-decodes @s (@n bytes) into @buf (@cap bytes, NUL-terminated). Returns the
 * decoded length, or -1 (a bad escape, a NUL, too long). */
static long decode(const char *s, size_t n, char *buf, size_t cap)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c == '+') {
            c = ' ';
        } else if (c == '%') {
            int hi = i + 2 < n ? hp_hex_digit(s[i + 1]) : -1;
            int lo = i + 2 < n ? hp_hex_digit(s[i + 2]) : -1;
            if (hi < 0 || lo < 0)
                return -1;
            c = (char)(hi << 4 | lo);
            i += 2;
        }
        if (c == '\0' || k + 1 >= cap)
            return -1;
        buf[k++] = c;
    }
    if (cap == 0)
        return -1;
    buf[k] = '\0';
    return (long)k;
}

int http_query_get(const char *q, size_t len, const char *name, char *buf, size_t buf_len)
{
    int found = 0;
    char key[64];
    for (size_t pos = 0; pos < len;) {
        const char *amp = memchr(q + pos, '&', len - pos);
        size_t end = amp ? (size_t)(amp - q) : len;
        const char *eq = memchr(q + pos, '=', end - pos);
        size_t kend = eq ? (size_t)(eq - q) : end;
        long kn = decode(q + pos, kend - pos, key, sizeof(key));
        /* A key we cannot read is not the one asked for: only a bad value of ours fails. */
        if (kn >= 0 && strcmp(key, name) == 0) {
            if (found)
                return -1;
            size_t vstart = eq ? kend + 1 : end;
            if (decode(q + vstart, end - vstart, buf, buf_len) < 0)
                return -1;
            found = 1;
        }
        pos = end + 1;
    }
    return found;
}

bool http_path_is(const struct http_request *req, const char *want)
{
    size_t n = strlen(want);
    return req->path_len == n && memcmp(req->path, want, n) == 0;
}
