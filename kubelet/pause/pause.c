/* The pause container's process: holds the pod's namespaces, reaps zombies, and exits
 * cleanly on SIGTERM/SIGINT. Built statically by scripts/images (gcc -static). */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_term(int sig) { (void)sig; _exit(0); }
static void on_chld(int sig) {
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {}
}

int main(void) {
    struct sigaction term = {0}, chld = {0};
    term.sa_handler = on_term;
    sigaction(SIGINT, &term, NULL);
    sigaction(SIGTERM, &term, NULL);
    chld.sa_handler = on_chld;
    chld.sa_flags = SA_NOCLDSTOP;
    sigaction(SIGCHLD, &chld, NULL);
    for (;;) pause();
    return 0;
}
