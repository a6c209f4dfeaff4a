"""Print the Python source kafka_wire generates for one message, to read or debug it.

.venv/bin/python tools/codec_source.py MetadataResponse 12
.venv/bin/python tools/codec_source.py 3 12 response
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kafka_wire._codegen import generated_source
from kafka_wire._schema import registry


def main(argv: list[str]) -> int:
    if len(argv) == 2:
        name, version = argv[0], int(argv[1])
        f = registry().file_for(name, version)
    elif len(argv) == 3:
        api_key, version, kind = int(argv[0]), int(argv[1]), argv[2]
        f = registry().file_for_key(api_key, kind, version)
    else:
        print(__doc__, file=sys.stderr)
        return 2
    print(f"# {f.name} v{version} from {f.source} ({f.resource})")
    print(generated_source(f.spec(), version))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
