/* The "relay floor" of the sbus 1->1 scenarios (bench/sbus_floor.py compiles and runs it):
 * the least a relay over AF_UNIX SOCK_SEQPACKET can do per message, so that the kernel's
 * share of a delivery is measured beside the broker, with the same clients, in the same run.
 *
 *     sbus_relay PATH
 *
 * Single-threaded, epoll, non-blocking sockets. It knows just enough of the sbus wire format
 * for the harness's clients:
 *   SUB <key>                 remember that this client wants <key> (exact match, no patterns)
 *   CMSG !/cred/whoami        answer CMSG !/cred/whoami\0!/cred/<gid>/<uid>/<pid> (SO_PEERCRED)
 *   MSG <key>\0<payload>      forward the packet unchanged to every client that sent SUB <key>
 * and ignores every other packet. A readable socket is read one recv per packet until EAGAIN
 * (as the broker does), and every delivery is one send; a send that would block waits in
 * poll() on that subscriber: a floor, not a broker (no queues, no flood control).
 * Prints "relay listening on PATH" once it accepts connections; runs until killed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define MAX_PACKET (1 << 18) /* above the kernel's default seqpacket limit (~212 KiB) */
#define MAX_EVENTS 64

struct sub {
    int fd;
    size_t len;
    char *key;
};

static struct sub *subs;
static size_t nsubs, capsubs;
static char buf[MAX_PACKET];

static void die(const char *what) {
    fprintf(stderr, "relay: %s: %s\n", what, strerror(errno));
    exit(1);
}

static void subscribe(int fd, const char *key, size_t len) {
    if (nsubs == capsubs) {
        capsubs = capsubs ? 2 * capsubs : 16;
        subs = realloc(subs, capsubs * sizeof *subs);
        if (!subs)
            die("realloc");
    }
    subs[nsubs].fd = fd;
    subs[nsubs].len = len;
    subs[nsubs].key = malloc(len ? len : 1);
    if (!subs[nsubs].key)
        die("malloc");
    memcpy(subs[nsubs].key, key, len);
    nsubs++;
}

static void drop(int epfd, int fd) {
    size_t kept = 0;
    for (size_t i = 0; i < nsubs; i++) {
        if (subs[i].fd == fd)
            free(subs[i].key);
        else
            subs[kept++] = subs[i];
    }
    nsubs = kept;
    epoll_ctl(epfd, EPOLL_CTL_DEL, fd, NULL);
    close(fd);
}

/* One packet to one client; blocks (in poll) while its socket is full. 0, or -1 if the
 * client is gone. */
static int deliver(int fd, const char *packet, size_t len) {
    for (;;) {
        if (send(fd, packet, len, MSG_NOSIGNAL) >= 0)
            return 0;
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN)
            return -1;
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        if (poll(&p, 1, -1) < 0 && errno != EINTR)
            die("poll");
        if (p.revents & (POLLERR | POLLHUP))
            return -1;
    }
}

static void whoami(int fd) {
    struct ucred cred;
    socklen_t len = sizeof cred;
    char reply[128];
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0)
        die("SO_PEERCRED");
    int n = snprintf(reply, sizeof reply, "CMSG !/cred/whoami%c!/cred/%u/%u/%d", '\0',
                     (unsigned)cred.gid, (unsigned)cred.uid, (int)cred.pid);
    deliver(fd, reply, (size_t)n);
}

/* Forward MSG <key>\0... to the key's subscribers; the clients that are gone are collected
 * in ``gone`` and dropped by the caller (not while ``subs`` is being walked). */
static void publish(const char *packet, size_t len, int *gone, size_t *ngone) {
    const char *key = packet + 4;
    const char *nul = memchr(key, '\0', len - 4);
    size_t klen = nul ? (size_t)(nul - key) : len - 4;
    for (size_t i = 0; i < nsubs; i++) {
        if (subs[i].len == klen && memcmp(subs[i].key, key, klen) == 0 &&
            deliver(subs[i].fd, packet, len) < 0 && *ngone < MAX_EVENTS)
            gone[(*ngone)++] = subs[i].fd;
    }
}

/* Read ``fd`` until EAGAIN (or it is gone: 1). */
static int serve(int fd, int *gone, size_t *ngone) {
    for (;;) {
        ssize_t n = recv(fd, buf, sizeof buf, MSG_TRUNC);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return errno == EAGAIN ? 0 : 1;
        }
        if (n == 0)
            return 1; /* end of stream (or an empty packet, which reads the same) */
        if ((size_t)n > sizeof buf)
            return 1; /* larger than any sbus packet */
        if (n > 4 && memcmp(buf, "MSG ", 4) == 0)
            publish(buf, (size_t)n, gone, ngone);
        else if (n > 4 && memcmp(buf, "SUB ", 4) == 0)
            subscribe(fd, buf + 4, (size_t)n - 4);
        else if (n == 18 && memcmp(buf, "CMSG !/cred/whoami", 18) == 0)
            whoami(fd);
    }
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s PATH\n", argv[0]);
        return 2;
    }
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(argv[1]) >= sizeof addr.sun_path) {
        fprintf(stderr, "relay: path too long\n");
        return 2;
    }
    strcpy(addr.sun_path, argv[1]);
    int lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (lfd < 0)
        die("socket");
    if (bind(lfd, (struct sockaddr *)&addr, sizeof addr) < 0)
        die("bind");
    if (listen(lfd, 128) < 0)
        die("listen");
    int epfd = epoll_create1(EPOLL_CLOEXEC);
    if (epfd < 0)
        die("epoll_create1");
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = lfd};
    if (epoll_ctl(epfd, EPOLL_CTL_ADD, lfd, &ev) < 0)
        die("epoll_ctl");
    printf("relay listening on %s\n", argv[1]);
    fflush(stdout);

    struct epoll_event events[MAX_EVENTS];
    int gone[MAX_EVENTS + 1]; /* publish() fills MAX_EVENTS at most, serve() adds one */
    for (;;) {
        int n = epoll_wait(epfd, events, MAX_EVENTS, -1);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            die("epoll_wait");
        }
        for (int i = 0; i < n; i++) {
            int fd = events[i].data.fd;
            if (fd == lfd) {
                int cfd;
                while ((cfd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
                    struct epoll_event cev = {.events = EPOLLIN, .data.fd = cfd};
                    if (epoll_ctl(epfd, EPOLL_CTL_ADD, cfd, &cev) < 0)
                        die("epoll_ctl");
                }
                continue;
            }
            size_t ngone = 0;
            if (serve(fd, gone, &ngone))
                gone[ngone++] = fd;
            for (size_t g = 0; g < ngone; g++) {
                /* a client listed twice (two SUBs) is closed once */
                int seen = 0;
                for (size_t h = 0; h < g; h++)
                    seen |= gone[h] == gone[g];
                if (!seen)
                    drop(epfd, gone[g]);
            }
        }
    }
}
