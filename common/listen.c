/* common/listen.c - listening sockets (listen.h). Called once per server
 * at start, from main threads. */
#include "listen.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int listen_family(const char *addr)
{
    struct in6_addr a6;
    struct in_addr a4;
    if (inet_pton(AF_INET, addr, &a4) == 1)
        return 0;
    if (inet_pton(AF_INET6, addr, &a6) == 1)
        return 1;
    return -1;
}

int listen_tcp(const char *addr, int port, int backlog, const char *what, int *fd,
               struct rl_err *err)
{
    *fd = -1;
    union {
        struct sockaddr sa;
        struct sockaddr_in v4;
        struct sockaddr_in6 v6;
    } sa;
    memset(&sa, 0, sizeof sa);
    socklen_t len;
    int fam = listen_family(addr);
    if (port < 1 || port > 65535)
        return rl_errf(err, RL_EINVAL, "%s: port %d is not in 1-65535", what, port);
    if (fam == 0) {
        sa.v4.sin_family = AF_INET;
        sa.v4.sin_port = htons((uint16_t)port);
        inet_pton(AF_INET, addr, &sa.v4.sin_addr);
        len = sizeof sa.v4;
    } else if (fam == 1) {
        sa.v6.sin6_family = AF_INET6;
        sa.v6.sin6_port = htons((uint16_t)port);
        inet_pton(AF_INET6, addr, &sa.v6.sin6_addr);
        len = sizeof sa.v6;
    } else {
        return rl_errf(err, RL_EINVAL, "%s: \"%.64s\" is not an IPv4 or IPv6 address", what,
                       addr);
    }
    int s = socket(sa.sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0)
        return rl_errf(err, RL_EIO, "cannot listen on %s port %d (%s): socket: %s", addr, port,
                       what, strerror(errno));
    int one = 1;
    /* SO_REUSEADDR, never SO_REUSEPORT: see listen.h */
    if (setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) ||
        (fam == 1 && setsockopt(s, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one))) {
        int e = errno;
        close(s);
        return rl_errf(err, RL_EIO, "cannot listen on %s port %d (%s): setsockopt: %s", addr,
                       port, what, strerror(e));
    }
    if (bind(s, &sa.sa, len) || listen(s, backlog > 0 ? backlog : 128)) {
        int e = errno;
        close(s);
        return rl_errf(err, RL_EIO, "cannot listen on %s port %d (%s): %s%s%s%s", addr, port,
                       what, strerror(e),
                       e == EADDRINUSE ? " (another process listens there: give " : "",
                       e == EADDRINUSE ? what : "", e == EADDRINUSE ? " another port)" : "");
    }
    *fd = s;
    return 0;
}
