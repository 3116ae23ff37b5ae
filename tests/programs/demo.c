/* tests/programs/demo.c: the demo program of scripts/demo.sh. A tiny "service" that
 * parses requests, caches responses (and leaks some), and builds a report. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NOINLINE __attribute__((noinline))

struct request {
    char *path;
    char *body;
};

struct cache_entry {
    struct cache_entry *next;
    char key[64];
    char *value;
};

static struct cache_entry *cache;

struct request *parse_request(int i);
void free_request(struct request *r);
void cache_response(const char *key, size_t size);
char *build_report(int n);

NOINLINE struct request *parse_request(int i)
{
    struct request *r = malloc(sizeof(*r));
    r->path = malloc(128);
    snprintf(r->path, 128, "/items/%d", i % 50);
    r->body = calloc(1, 2048);
    return r;
}

NOINLINE void free_request(struct request *r)
{
    free(r->path);
    free(r->body);
    free(r);
}

NOINLINE void cache_response(const char *key, size_t size)
{
    struct cache_entry *e = malloc(sizeof(*e));
    snprintf(e->key, sizeof(e->key), "%s", key);
    e->value = malloc(size);
    memset(e->value, 'x', size);
    e->next = cache;
    cache = e; /* never evicted: this is the leak */
}

NOINLINE char *build_report(int n)
{
    char *buf = NULL;
    size_t len = 0;
    for (int i = 0; i < n; i++) {
        buf = realloc(buf, len + 100);
        len += (size_t)snprintf(buf + len, 100, "line %d\n", i);
    }
    return buf;
}

int main(void)
{
    for (int i = 0; i < 20000; i++) {
        struct request *r = parse_request(i);
        if (i % 10 == 0)
            cache_response(r->path, 4096);
        free_request(r);
    }
    char *report = build_report(2000);
    printf("demo: handled 20000 requests, report of %zu bytes\n", strlen(report));
    free(report);
    return 0;
}
