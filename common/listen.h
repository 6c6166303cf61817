/* common/listen.h - the listening TCP sockets of the worker's and the
 * dispatcher's HTTP servers, opened by us rather than by libmicrohttpd so
 * that a port already taken is an error that names the port and the reason,
 * and so that no socket option lets a second process share a port.
 *
 * libmicrohttpd, asked to bind itself, says only that the start failed;
 * and with MHD_OPTION_LISTENING_ADDRESS_REUSE it sets SO_REUSEPORT, with
 * which two unrelated dispatchers on one port both start and the kernel
 * splits connections between them in silence. listen_tcp() sets
 * SO_REUSEADDR only (a restart need not wait out TIME_WAIT; a port someone
 * listens on still refuses a second bind). The socket goes to
 * libmicrohttpd with MHD_OPTION_LISTEN_SOCKET. */
#ifndef RL_LISTEN_H
#define RL_LISTEN_H

#include "err.h"

/* Opens a listening TCP socket on addr (an IPv4 or IPv6 literal) and
 * port (1-65535), close-on-exec, backlog `backlog`. what names the option
 * that chose the port, for the message ("http_port"). *fd gets the socket,
 * owned by the caller (libmicrohttpd closes it when handed over).
 * Returns 0; -RL_EINVAL for an address that is not a literal; -RL_EIO when
 * the port cannot be had: "cannot listen on 127.0.0.1 port 9465
 * (http_port): Address already in use" (+ a hint when it is taken). */
int listen_tcp(const char *addr, int port, int backlog, const char *what, int *fd,
               struct rl_err *err);

/* 1 when addr is an IPv6 literal, 0 for IPv4, -1 for neither. */
int listen_family(const char *addr);

#endif
