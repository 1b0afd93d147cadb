/* The sandbox ("pause") container's process for the dev cluster's real node: it holds the pod's
 * namespaces open and does nothing else. As PID 1 of its PID namespace it gets no default signal
 * actions, so it installs handlers to exit promptly on SIGINT/SIGTERM and reaps zombies on SIGCHLD.
 * Written for Patchbay; built statically by patchbay_devcluster.images. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) { (void)sig; _exit(0); }

static void reap(int sig) {
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction term = {0}, chld = {0};
    term.sa_handler = stop;
    chld.sa_handler = reap;
    chld.sa_flags = SA_NOCLDSTOP;
    if (sigaction(SIGINT, &term, NULL) < 0 || sigaction(SIGTERM, &term, NULL) < 0 ||
        sigaction(SIGCHLD, &chld, NULL) < 0) {
        return 1;
    }
    for (;;) {
        pause();
    }
}
