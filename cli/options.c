/* cli/options.c: the commands' options for configuration fields, built from the service's
 * field table (service/config.h): getopt_long's option array, applying a value with one
 * message format for every bad value, and the --help lines. */
#include "cli/cli.h"

#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

/* Pseudo-field for "--continuous-dump MS[,PHASE_MS]": both continuous_dump_config
 * fields in one flag. */
#define CLI_CONT_DUMP "continuous_dump_config"

int cli_opts_build(struct cli_opts *o, const struct option *own, const char *own_short,
                   const struct cli_field *fields)
{
    size_t n_own = 0, n_fields = 0;
    while (own[n_own].name)
        n_own++;
    while (fields[n_fields].name)
        n_fields++;
    memset(o, 0, sizeof(*o));
    /* Each field may add a negative flag: at most two options per field. */
    o->longopts = calloc(n_own + 2 * n_fields + 1, sizeof(*o->longopts));
    o->fields = calloc(n_fields + 1, sizeof(*o->fields));
    o->flags = calloc(n_fields + 1, sizeof(*o->flags));
    if (!o->longopts || !o->fields || !o->flags) {
        cli_opts_done(o);
        return -ENOMEM;
    }
    memcpy(o->longopts, own, n_own * sizeof(*own));
    size_t k = n_own;
    size_t sl = strlen(own_short);
    if (sl >= sizeof(o->shortopts))
        sl = sizeof(o->shortopts) - 1;
    memcpy(o->shortopts, own_short, sl);
    for (size_t i = 0; i < n_fields; i++) {
        const struct cli_field *cf = &fields[i];
        const struct svc_config_field *f =
            strcmp(cf->name, CLI_CONT_DUMP) ? svc_config_field_find(cf->name) : NULL;
        if (!f && strcmp(cf->name, CLI_CONT_DUMP)) {
            cli_opts_done(o);
            return -ENOENT; /* a programmer error: a field name not in the table */
        }
        o->fields[i] = f;
        o->flags[i] = cf->flag ? cf->flag : f ? f->flag : "continuous-dump";
        char sf = cf->flag ? cf->short_flag : f ? f->short_flag : 0;
        bool has_arg = !f || (f->type != SVC_FIELD_BOOL && f->type != SVC_FIELD_ACCEPTED);
        o->longopts[k++] = (struct option){o->flags[i], has_arg ? required_argument : no_argument,
                                           NULL, CLI_OPT_FIELD + (int)i};
        if (f && f->no_flag)
            o->longopts[k++] =
                (struct option){f->no_flag, no_argument, NULL, CLI_OPT_FIELD_NEG + (int)i};
        if (sf && sl + 2 < sizeof(o->shortopts)) {
            o->shortopts[sl++] = sf;
            if (has_arg)
                o->shortopts[sl++] = ':';
            o->short_map[(unsigned char)sf] = (int)i + 1;
        }
    }
    o->n_fields = n_fields;
    return 0;
}

void cli_opts_done(struct cli_opts *o)
{
    free(o->longopts);
    free(o->fields);
    free(o->flags);
    memset(o, 0, sizeof(*o));
}

/* "INTERVAL_MS[,PHASE_MS]" into cfg->dump_interval_ms/dump_phase_ms; -EINVAL. */
int cli_parse_continuous_dump(const char *arg, struct svc_config *cfg)
{
    char buf[64];
    uint64_t iv, ph = 0;
    size_t n = strlen(arg);
    if (n >= sizeof(buf))
        return -EINVAL;
    memcpy(buf, arg, n + 1);
    char *comma = strchr(buf, ',');
    if (comma) {
        *comma = '\0';
        if (svc_parse_uint(comma + 1, false, &ph) < 0 || ph > UINT32_MAX)
            return -EINVAL;
    }
    if (svc_parse_uint(buf, false, &iv) < 0 || iv < 10 || iv > UINT32_MAX)
        return -EINVAL;
    cfg->dump_interval_ms = (uint32_t)iv;
    cfg->dump_phase_ms = (uint32_t)ph;
    return 0;
}

int cli_opts_apply(const struct cli_opts *o, int c, const char *arg, struct svc_config *cfg,
                   const char *prog)
{
    size_t i;
    bool neg = false;
    if (c >= CLI_OPT_FIELD_NEG && c < CLI_OPT_FIELD_NEG + (int)o->n_fields) {
        i = (size_t)(c - CLI_OPT_FIELD_NEG);
        neg = true;
    } else if (c >= CLI_OPT_FIELD && c < CLI_OPT_FIELD + (int)o->n_fields) {
        i = (size_t)(c - CLI_OPT_FIELD);
    } else if (c > 0 && c < 256 && o->short_map[c]) {
        i = (size_t)o->short_map[c] - 1;
    } else {
        return 0;
    }
    const struct svc_config_field *f = o->fields[i];
    if (!f) {
        if (cli_parse_continuous_dump(arg, cfg) < 0) {
            fprintf(stderr,
                    "%s: invalid --continuous-dump '%s': expected INTERVAL_MS[,PHASE_MS] with "
                    "INTERVAL_MS >= 10\n",
                    prog, arg);
            return -1;
        }
        return 1;
    }
    if (neg) {
        svc_config_set_bool(cfg, f, false);
        return 1;
    }
    char err[256];
    if (svc_config_set_text(cfg, f, arg, err, sizeof(err)) < 0) {
        fprintf(stderr, "%s: invalid %s '%s': %s\n", prog, f->what, arg, err);
        return -1;
    }
    return 1;
}

/* Writes @text wrapped to 80 columns, continuation lines indented by @indent. */
static void print_wrapped(FILE *f, size_t col, size_t indent, const char *text)
{
    const char *p = text;
    while (*p) {
        size_t room = col < 80 ? 80 - col : 1;
        size_t len = strlen(p);
        size_t take = len;
        if (len > room) {
            take = room;
            while (take > 0 && p[take] != ' ')
                take--;
            if (take == 0)
                take = len; /* one long word */
        }
        fprintf(f, "%.*s\n", (int)take, p);
        p += take;
        while (*p == ' ')
            p++;
        if (*p)
            fprintf(f, "%*s", (int)indent, "");
        col = indent;
    }
}

void cli_opts_help(FILE *f, const struct cli_opts *o)
{
    for (size_t i = 0; i < o->n_fields; i++) {
        const struct svc_config_field *fd = o->fields[i];
        char left[64];
        char sf = 0;
        for (int c = 1; c < 256; c++)
            if (o->short_map[c] == (int)i + 1)
                sf = (char)c;
        const char *arg = fd ? fd->arg_help : "MS[,PHASE_MS]";
        int n = snprintf(left, sizeof(left), "  %c%c%s--%s%s%s", sf ? '-' : ' ', sf ? sf : ' ',
                         sf ? ", " : "  ", o->flags[i], arg ? " " : "", arg ? arg : "");
        if (n < 0)
            continue;
        fputs(left, f);
        size_t col = (size_t)n;
        if (col >= 31) {
            fputc('\n', f);
            col = 0;
        }
        fprintf(f, "%*s", (int)(31 - col), "");
        print_wrapped(f, 31, 31,
                      fd ? fd->help : "also dump every MS milliseconds (the first after PHASE_MS)");
        if (fd && fd->no_flag)
            fprintf(f, "      --%-22s the opposite\n", fd->no_flag);
    }
}

int cli_common_apply(struct cli_common_opts *co, int c, const char *arg, const char *prog)
{
    switch (c) {
    case 'o':
        co->output = arg;
        return 1;
    case CLI_OPT_STATUS:
        co->status_line = true;
        return 1;
    case CLI_OPT_NO_STATUS:
        co->status_line = false;
        return 1;
    case CLI_OPT_TOP:
        if (cli_parse_range(arg, 0, 100000, &co->top) < 0) {
            fprintf(stderr, "%s: invalid --top '%s'\n", prog, arg);
            return -1;
        }
        return 1;
    case 'q':
        co->quiet = true;
        return 1;
    default:
        return 0;
    }
}

int cli_parse_range(const char *s, uint64_t min, uint64_t max, uint64_t *ret)
{
    uint64_t v;
    if (svc_parse_uint(s, false, &v) < 0 || v < min || v > max)
        return -EINVAL;
    *ret = v;
    return 0;
}
