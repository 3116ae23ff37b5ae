/* service/config_proto.c: a serialized HeapprofdConfig (what Perfetto's tracing service
 * hands the data source android.heapprofd) onto struct svc_config, through the one table
 * of fields (service/config.c): each field number found there is checked and set the
 * way a flag or a config file line of the same name is. The bytes come from traced,
 * written by whoever wrote the trace config: untrusted. */
#include "service/config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/pbwire.h"

/* HeapprofdConfig.continuous_dump_config (a nested ContinuousDumpConfig). */
#define CONTINUOUS_DUMP_CONFIG 6

static const struct svc_config_field *field_by_number(uint32_t num, bool nested)
{
    for (size_t i = 0; i < svc_n_config_fields; i++) {
        const struct svc_config_field *f = &svc_config_fields[i];
        if (f->proto_id == num && !!(f->flags & SVC_FIELD_NESTED_DUMP) == nested)
            return f;
    }
    return NULL;
}

static bool is_string(const struct svc_config_field *f)
{
    return f->type == SVC_FIELD_CMDLINES || f->type == SVC_FIELD_HEAPS;
}

/* Applies one field. Returns 0, 1 (ignored: not a field heapprof knows), -EINVAL. */
static int apply(struct svc_config *cfg, const struct hp_pb_field *pf, bool nested, char *err,
                 size_t err_len)
{
    const struct svc_config_field *f = field_by_number(pf->num, nested);
    if (!f)
        return 1;
    char e[200];
    if (is_string(f)) {
        if (pf->wire_type != HP_PB_LEN || memchr(pf->ptr, '\0', pf->len) || pf->len > 4096) {
            snprintf(err, err_len, "heapprofd_config: %s: not a valid string", f->name);
            return -EINVAL;
        }
        char *s = strndup((const char *)pf->ptr, pf->len);
        if (!s)
            return -ENOMEM;
        int r = svc_config_set_string(cfg, f, s, e, sizeof(e));
        free(s);
        if (r < 0)
            snprintf(err, err_len, "heapprofd_config: %s", e);
        return r;
    }
    if (f->type == SVC_FIELD_PIDS) {
        /* repeated uint64, packed or not */
        struct hp_pb_ints ints;
        uint64_t v;
        bool bad = pf->wire_type != HP_PB_VARINT && pf->wire_type != HP_PB_LEN;
        if (!bad) {
            hp_pb_ints_init(&ints, pf);
            while (hp_pb_ints_next(&ints, &v, &bad)) {
                if (svc_config_set_uint(cfg, f, v, e, sizeof(e)) < 0) {
                    snprintf(err, err_len, "heapprofd_config: %s", e);
                    return -EINVAL;
                }
            }
        }
        if (bad) {
            snprintf(err, err_len, "heapprofd_config: %s: malformed", f->name);
            return -EINVAL;
        }
        return 0;
    }
    if (pf->wire_type != HP_PB_VARINT) {
        snprintf(err, err_len, "heapprofd_config: %s: not a varint", f->name);
        return -EINVAL;
    }
    if (f->type == SVC_FIELD_BOOL || f->type == SVC_FIELD_ACCEPTED) {
        svc_config_set_bool(cfg, f, pf->varint != 0);
        return 0;
    }
    if (svc_config_set_uint(cfg, f, pf->varint, e, sizeof(e)) < 0) {
        snprintf(err, err_len, "heapprofd_config: %s", e);
        return -EINVAL;
    }
    return 0;
}

int svc_config_from_proto(const void *buf, size_t len, struct svc_config *cfg, char *err,
                          size_t err_len)
{
    struct hp_pb_iter it, ni;
    struct hp_pb_field f, nf;
    char ignored[128] = "";
    size_t n_ignored = 0;
    int r;
    err[0] = '\0';
    hp_pb_iter_init(&it, buf, len);
    while (hp_pb_next(&it, &f)) {
        if (f.num == CONTINUOUS_DUMP_CONFIG) {
            if (f.wire_type != HP_PB_LEN) {
                snprintf(err, err_len, "heapprofd_config: continuous_dump_config: malformed");
                return -EINVAL;
            }
            hp_pb_iter_init(&ni, f.ptr, f.len);
            while (hp_pb_next(&ni, &nf))
                if ((r = apply(cfg, &nf, true, err, err_len)) < 0)
                    return r;
            if (ni.error) {
                snprintf(err, err_len, "heapprofd_config: continuous_dump_config: malformed");
                return -EINVAL;
            }
            continue;
        }
        r = apply(cfg, &f, false, err, err_len);
        if (r < 0)
            return r;
        if (r == 1 && n_ignored++ < 8) {
            size_t l = strlen(ignored);
            snprintf(ignored + l, sizeof(ignored) - l, "%s%u", l ? ", " : "", f.num);
        }
    }
    if (it.error) {
        snprintf(err, err_len, "heapprofd_config: malformed protobuf");
        return -EINVAL;
    }
    if (n_ignored)
        snprintf(err, err_len,
                 "heapprofd_config fields heapprof does not implement were ignored: %s", ignored);
    return 0;
}
