// `flashinfer list-ops`: every declared op, from the op declarations.
#include <cstdio>
#include <string>

#include "commands.h"
#include "flashinfer/op_decl.h"
#include "flashinfer/ops/backends.h"

namespace flashinfer::cli {

Command list_ops_command() {
  return {"list-ops", "List every declared op with its FlashInfer module and signature",
          [](Args& sub) {
            auto verbose = std::make_shared<bool>(false);
            auto module = std::make_shared<std::string>();
            sub.add_flag("-v,--verbose", *verbose, "Also print each parameter's kind");
            sub.add_option("--module", *module, "Only ops of this FlashInfer module");
            return std::function<int()>([verbose, module] {
              int n = 0;
              for (const OpDecl* d : OpRegistry::global().ops()) {
                if (!module->empty() && d->module != *module) continue;
                ++n;
                std::printf("%-48s %-20s %s\n", d->name.c_str(), d->module.c_str(),
                            d->signature().c_str());
                if (*verbose) {
                  if (!d->summary.empty()) std::printf("    %s\n", d->summary.c_str());
                  for (const ParamDecl& p : d->params) {
                    std::string kind(param_kind_name(p.kind));
                    if (!p.type_name.empty()) kind += " " + p.type_name;
                    std::printf("    %-24s %s%s%s%s%s\n", p.name.c_str(), kind.c_str(),
                                p.optional ? " | None" : "", p.keyword_only ? " (keyword)" : "",
                                p.in_kwargs ? " (via **kwargs)" : "",
                                p.mutated ? " (written by the op)" : "");
                  }
                  std::printf("    -> %s\n", d->returns.c_str());
                  for (const auto& [backend, impl] : op_backend_implementations(d->name)) {
                    std::printf("    backend %-6s %s\n", backend.c_str(), impl.c_str());
                  }
                }
              }
              std::printf("%d ops\n", n);
              return 0;
            });
          }};
}

}  // namespace flashinfer::cli
