// What every generated translation unit includes before its own code (CppEmitter's header and
// runner), precompiled once by tests/e2e/CMakeLists.txt (target e2e_prelude_pch) and included
// first (-include) by the e2e cases' builds, which would otherwise each parse it again: about a
// second per build, 15-30% of a small program's compile. Where the precompiled form does not fit
// a build's flags (another -O level, a sanitizer), GCC reads this text instead: same meaning.
#include "meshc/GeneratedSupport.h"
#include "meshrt/Launch.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>
