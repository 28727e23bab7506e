/*
 * gethostname() for a training container: it answers the job's host name
 * (resourceconfig.json's current_host, e.g. "algo-1") instead of the
 * container's own, for the libraries that name a host by it (MPI, NCCL,
 * gloo). start_with_right_hostname.sh compiles this file when the container
 * starts, with the name as the macro JOB_HOST_NAME, and preloads the library
 * into `train` (LD_PRELOAD), whose processes inherit it.
 *
 * Written for training-toolkit's docker/dlc-pytorch image, after the
 * behaviour of the PyTorch DLC's hostname library.
 */
#include <errno.h>
#include <string.h>
#include <unistd.h>

#ifndef JOB_HOST_NAME
#error "build with -DJOB_HOST_NAME='\"algo-1\"'"
#endif

int gethostname(char *name, size_t len)
{
    static const char host[] = JOB_HOST_NAME;

    /* As glibc does when the buffer is short: a truncated name, no NUL, ENAMETOOLONG. */
    if (len < sizeof host) {
        memcpy(name, host, len);
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(name, host, sizeof host);
    return 0;
}
