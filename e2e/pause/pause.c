/* The lab's pod sandbox init (what the pause image runs): holds the pod's
 * namespaces open, reaps whatever is reparented to it, and exits on SIGINT
 * or SIGTERM. Signals are taken synchronously (blocked, then waited for),
 * so no handler runs. Linked statically: the image holds this file alone. */
#include <signal.h>
#include <stddef.h>
#include <sys/wait.h>

int main(void)
{
	sigset_t wanted;
	sigemptyset(&wanted);
	sigaddset(&wanted, SIGINT);
	sigaddset(&wanted, SIGTERM);
	sigaddset(&wanted, SIGCHLD);
	if (sigprocmask(SIG_BLOCK, &wanted, NULL) != 0)
		return 1;
	for (;;) {
		int sig = sigwaitinfo(&wanted, NULL);
		if (sig == SIGINT || sig == SIGTERM)
			return 0;
		if (sig == SIGCHLD)
			while (waitpid(-1, NULL, WNOHANG) > 0)
				;
	}
}
