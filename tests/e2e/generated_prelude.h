// The e2e cases' precompiled prelude: the headers every generated translation unit includes
// (meshc/GeneratedPrelude.h, the list `meshc run` precompiles too), precompiled once by
// tests/e2e/CMakeLists.txt (target e2e_prelude_pch) and included first (-include) by the cases'
// builds: about a second per build, 15-30% of a small program's compile. Where the precompiled
// form does not fit a build's flags (another -O level, a sanitizer), GCC reads this text instead:
// same meaning.
#include "meshc/GeneratedPrelude.h"
