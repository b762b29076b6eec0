// The process exit status of every dflash-host command, in one place: the
// CLI returns them, the trainer and the pipeline's ranks return the ones
// they cause, and docs/training.md lists them for scripts that check.
#pragma once

namespace dflash {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;      // a failure while running
inline constexpr int kExitUsage = 2;        // bad usage or configuration
inline constexpr int kExitUnavailable = 3;  // a feature this build does not have
// Non-finite losses stopped the run (after the policy allowed no more).
inline constexpr int kExitNonFinite = 4;
// The device ran out of memory (after the report and an emergency checkpoint
// of the last completed step).
inline constexpr int kExitOutOfMemory = 5;
inline constexpr int kExitDoesNotFit = 6;  // the memory plan says the run will not fit
// SIGTERM or SIGINT asked the run to stop (train/stop_request.h): the step in
// progress finished and was checkpointed; the same command resumes.
inline constexpr int kExitStoppedOnRequest = 7;
inline constexpr int kExitSomeArmsFailed = 8;  // ab: the report is written, and an arm or seed failed

}  // namespace dflash
