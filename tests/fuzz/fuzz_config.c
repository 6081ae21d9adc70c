/* libFuzzer target: the config file parser (daemon/config.c) — `key value` lines,
 * comments, size / duration / ratio / enum values — then every key read back and
 * re-applied from its canonical text (which must parse again). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    mfd_config_t cfg;
    char err[MFD_CONFIG_ERRLEN];
    if (mfd_config_init(&cfg) != MF_OK)
        return 0;
    if (mfd_config_parse_text(&cfg, "fuzz.conf", (const char *)data, size, err, sizeof(err)) ==
        MF_OK) {
        mfd_config_t copy;
        if (mfd_config_init(&copy) != MF_OK)
            abort();
        for (size_t i = 0; i < mfd_config_count(); i++) {
            const char *k = mfd_config_key(i);
            char v[4352];
            if (mfd_config_get(&cfg, k, 0, v, sizeof(v)) != MF_OK)
                abort();
            /* Watermarks are a pair checked against each other: order may refuse one. */
            if (mfd_config_set(&copy, k, v, 0, err, sizeof(err)) != MF_OK &&
                strstr(k, "watermark") == NULL)
                abort();
        }
        mfd_config_deinit(&copy);
    }
    mfd_config_deinit(&cfg);
    return 0;
}
