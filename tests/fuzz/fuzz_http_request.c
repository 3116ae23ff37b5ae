/* tests/fuzz/fuzz_http_request.c: the HTTP request head parser and the query reader on
 * arbitrary bytes, as a client of heapprofd --http may send them. Checks the contract:
 * a parsed head lies within the input and within HTTP_MAX_HEAD, its fields point into it,
 * a refusal carries a status of 400, 431 or 505 and a reason. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "http/request.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_within(const char *buf, size_t len, const char *p, size_t n)
{
    if (n && (p < buf || p + n > buf + len))
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *buf = (const char *)data;
    struct http_request req;
    int r = http_parse_request(buf, size, &req);
    if (r < 0) {
        if ((r != -400 && r != -431 && r != -505) || !req.why_bad)
            abort();
        return 0;
    }
    if (r == 0)
        return 0;
    if ((size_t)r > size || r > HTTP_MAX_HEAD || (size_t)r != req.head_len)
        abort();
    check_within(buf, (size_t)r, req.path, req.path_len);
    check_within(buf, (size_t)r, req.query, req.query_len);
    if (req.path_len == 0 || req.path[0] != '/')
        abort();
    static const char *const names[] = {"pid", "name", "seconds", "debug", ""};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        char v[64];
        int q = http_query_get(req.query, req.query_len, names[i], v, sizeof(v));
        if (q < -1 || q > 1 || (q == 1 && strlen(v) >= sizeof(v)))
            abort();
    }
    return 0;
}
