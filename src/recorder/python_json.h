// Private: JSON text exactly as Python's json.dumps(obj) writes it (separators ", " and ": ",
// ensure_ascii, floats as repr(), NaN/Infinity bare), so our records read like upstream's.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace flashinfer::recorder {

using Json = nlohmann::ordered_json;

std::string python_json_dumps(const Json& j);

}  // namespace flashinfer::recorder
