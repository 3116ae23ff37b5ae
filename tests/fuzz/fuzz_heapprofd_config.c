/* tests/fuzz/fuzz_heapprofd_config.c: a serialized HeapprofdConfig (as traced hands it
 * over) onto svc_config, on arbitrary bytes. */
#include <stddef.h>
#include <stdint.h>

#include "service/svc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct svc_config cfg;
    char err[256];
    svc_config_init(&cfg);
    if (svc_config_from_proto(data, size, &cfg, err, sizeof(err)) == 0) {
        int r = svc_config_check(&cfg, err, sizeof(err));
        (void)r;
        (void)svc_config_matches(&cfg, 1, "a", "a\0b\0", 4);
    }
    svc_config_done(&cfg);
    return 0;
}
