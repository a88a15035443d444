// What every generated C++ translation unit includes before its own code (CppEmitter's header and
// runner). meshc's build precompiles it for `meshc run` (target meshc_prelude, docs/tool.md), and
// tests/e2e (generated_prelude.h, target e2e_prelude_pch) once per build tree; each build then
// includes it first (-include) instead of parsing these headers again (about a second a build).
#pragma once

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
