// The configuration reference: every key the parser reads, its default and
// what it does, as the Markdown page docs/reference/configuration.md
// (`shoal config --reference` prints it). The keys come from the parser
// itself, watched while it parses configs that reach each of its branches,
// so a key added to the parser without a line here fails
// CheckConfigReference (and a test), and the page cannot drift from it.
#ifndef SHOAL_CONFIG_CONFIG_REFERENCE_H_
#define SHOAL_CONFIG_CONFIG_REFERENCE_H_

#include <set>
#include <string>

#include "absl/status/statusor.h"

namespace shoal {

struct ConfigKeysRead {
  std::set<std::string> keys;  // every path asked for: "cluster", "cluster.ps", "model.conv[0].kernel"
  std::string yaml;            // the config parsed, as JobConfigToYaml writes it (its defaults)
};

// Parses `yaml_text` as ParseJobConfig does, without the cross-field
// checks, and records every key path the parser reads. Defined in
// config.cc, beside the parser it watches.
absl::StatusOr<ConfigKeysRead> TraceConfigKeys(const std::string& yaml_text);

// Every key any config can set, with list items as `[]`
// ("model.conv[].kernel"), sections included ("training.optimizer").
absl::StatusOr<std::set<std::string>> AllConfigKeys();

// OK when every key has a description (its own, or a section's that
// stands for it) and every description names a key; else the first
// mismatch, named.
absl::Status CheckConfigReference();

// The page: one table per section, key, default and meaning.
absl::StatusOr<std::string> ConfigReferenceMarkdown();

}  // namespace shoal

#endif  // SHOAL_CONFIG_CONFIG_REFERENCE_H_
