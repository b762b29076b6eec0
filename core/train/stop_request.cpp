#include "train/stop_request.h"

#include <signal.h>

#include <csignal>

namespace dflash::train {
namespace {

volatile std::sig_atomic_t g_requested = 0;
struct sigaction g_previous_term {}, g_previous_int {};

// Async-signal-safe: the first signal is recorded; a second one gets the
// default action back and is raised again.
void on_stop_signal(int sig) {
  if (g_requested != 0) {
    struct sigaction fallback {};
    fallback.sa_handler = SIG_DFL;
    ::sigemptyset(&fallback.sa_mask);
    ::sigaction(sig, &fallback, nullptr);
    ::raise(sig);
    return;
  }
  g_requested = sig;
}

}  // namespace

StopRequest::StopRequest() {
  g_requested = 0;
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  ::sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // reads and writes in progress go on; the loop checks between steps
  ::sigaction(SIGTERM, &action, &g_previous_term);
  ::sigaction(SIGINT, &action, &g_previous_int);
}

StopRequest::~StopRequest() {
  ::sigaction(SIGTERM, &g_previous_term, nullptr);
  ::sigaction(SIGINT, &g_previous_int, nullptr);
}

int StopRequest::signal() const { return g_requested; }

const char* stop_signal_name(int signal) {
  switch (signal) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    default: return "a stop signal";
  }
}

}  // namespace dflash::train
