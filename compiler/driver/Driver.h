// The meshc driver: the single place that lists the pipeline in order
// (load sources -> parse -> sema/lower to IR -> interpret) and prints the stage asked for.
#pragma once

namespace meshc {

/// Exit codes: 0 success, 1 errors in the input, 2 internal error (e.g. cannot write output).
enum ExitCode { kExitOk = 0, kExitInputError = 1, kExitInternalError = 2 };

/// Runs meshc with command-line arguments; returns the process exit code.
int runMeshc(int argc, char** argv);

/// `meshc run` (RunCommand.cpp): whether the command line chose it, its --help filter, and the
/// command itself (after the command line was parsed).
bool runCommandChosen();
void hideUnrelatedRunOptions();
int runCommand(const char* argv0);

/// `meshc build-prelude DIR` (RunCommand.cpp): precompiles `meshc run`'s prelude into DIR, for
/// this meshc's build (target meshc_prelude). Whether it was chosen, and the command.
bool buildPreludeCommandChosen();
int buildPreludeCommand(const char* argv0);

/// `meshc calibrate` (CalibrateCommand.cpp), the same three.
bool calibrateCommandChosen();
void hideUnrelatedCalibrateOptions();
int calibrateCommand(const char* argv0);

} // namespace meshc
