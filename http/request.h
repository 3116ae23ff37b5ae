/* http/request.h: the parser of an HTTP/1.0 or 1.1 request head, and of the query
 * string of its target. Pure functions over bytes that come straight from a socket
 * (untrusted: tests/fuzz/fuzz_http_request.c): no allocation, no state, every field of
 * the result points into the caller's buffer.
 *
 *     struct http_request req;
 *     int r = http_parse_request(buf, len, &req);
 *     if (r == 0) ... read more ...;
 *     else if (r < 0) ... answer status -r (400, 431, 505) and close ...;
 *     else if (http_query_get(req.query, req.query_len, "pid", v, sizeof(v)) > 0) ...
 *
 * What is accepted: a request line `METHOD SP /origin-form SP HTTP/1.x`, header lines
 * `name: value`, and the empty line that ends the head, lines ended by CRLF or a bare
 * LF (RFC 9112 lets a recipient take either). Header values are checked but not kept:
 * the server reads no body and closes the connection after its answer.
 */
#ifndef HP_HTTP_REQUEST_H
#define HP_HTTP_REQUEST_H

#include <stdbool.h>
#include <stddef.h>

/* A head longer than this is refused with 431. */
#define HTTP_MAX_HEAD 8192
/* More header lines than this are refused with 431. */
#define HTTP_MAX_HEADERS 100

enum http_method { HTTP_METHOD_GET, HTTP_METHOD_HEAD, HTTP_METHOD_OTHER };

struct http_request {
    enum http_method method;
    int minor_version;   /* HTTP/1.<minor_version> */
    const char *path;    /* the target up to '?' (not decoded), starts with '/' */
    size_t path_len;     /* not NUL-terminated */
    const char *query;   /* after '?', "" when none */
    size_t query_len;    /* not NUL-terminated */
    size_t head_len;     /* bytes of the head, its empty line included */
    const char *why_bad; /* with a negative return: a one-line reason */
};

/* Parses the request head at the start of @buf (@len bytes). Returns the head's length
 * (> 0) with @ret filled; 0 when the bytes so far are a valid beginning of a head that
 * has not ended yet; or minus the HTTP status to answer, the reason in ret->why_bad:
 * -400 malformed, -431 longer than HTTP_MAX_HEAD or more than HTTP_MAX_HEADERS header
 * lines, -505 not HTTP/1.x. */
int http_parse_request(const char *buf, size_t len, struct http_request *ret);

/* The value of parameter @name in the query string @q (@len bytes, not decoded):
 * percent-decoded ('+' as space) into @buf (@buf_len bytes, NUL-terminated). Returns 1
 * when found, 0 when absent, -1 when malformed (a bad escape, a NUL, longer than
 * @buf_len - 1, or the name given twice). */
int http_query_get(const char *q, size_t len, const char *name, char *buf, size_t buf_len);

/* True when @path (@len bytes) is exactly @want. */
bool http_path_is(const struct http_request *req, const char *want);

#endif
