/* tests/fuzz/fuzz_config.c: the HeapprofdConfig text parser on arbitrary bytes. */
#include <stddef.h>
#include <stdint.h>

#include "service/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct svc_config cfg;
    char err[256];
    svc_config_init(&cfg);
    if (svc_config_parse_text((const char *)data, size, "fuzz", &cfg, err, sizeof(err)) == 0) {
        int r = svc_config_check(&cfg, err, sizeof(err));
        (void)r;
        (void)svc_config_matches(&cfg, 1, NULL, (const char *)data, size);
    }
    svc_config_done(&cfg);
    return 0;
}
