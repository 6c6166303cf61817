/* engine/backend.c - picks a backend implementation by name. */
#include "backend.h"
#include "rowsets.h"

#include <stdlib.h>
#include <string.h>

int be_create(struct backend **out, const char *name, const struct be_options *opt,
              struct rl_err *err)
{
    *out = NULL;
    if (!name || !strcmp(name, "cpu"))
        return cpu_backend_create(out, opt, err);
    if (!strcmp(name, "cpu-rowsets")) { /* tests: CUDA's reduced rows, on the CPU (rowsets.h) */
        struct backend *inner = NULL;
        int rc = cpu_backend_create(&inner, opt, err);
        return rc ? rc : rows_backend_wrap(out, inner, err);
    }
    if (!strcmp(name, "sim"))
        return sim_backend_create(out, opt, err);
    if (!strcmp(name, "cuda")) {
#ifdef REDLM_CUDA
        return cuda_backend_create(out, opt, err);
#else
        return rl_errf(err, RL_EUNSUPPORTED,
                       "backend \"cuda\" is not built in; rebuild with `make CUDA=1`");
#endif
    }
    return rl_errf(err, RL_EINVAL, "unknown backend \"%s\" (expected \"cpu\", \"cuda\" or \"sim\")", name);
}

void be_free(struct backend *be)
{
    if (!be)
        return;
    if (be->ops && be->ops->free)
        be->ops->free(be->ctx);
    free(be);
}
