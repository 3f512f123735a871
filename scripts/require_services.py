"""
Exit 0 when every URL given answers on its host and port. Otherwise exit 1 under
CI=true (a missing service is a failure there) and 2 elsewhere (the caller skips).
"""

import os
import socket
import sys
from urllib.parse import urlparse


def unreachable(urls):
    missing = []
    for url in urls:
        parts = urlparse(url)
        try:
            socket.create_connection((parts.hostname, parts.port), timeout=3).close()
        except OSError:
            missing.append(url)
    return missing


def main(urls):
    missing = unreachable(urls)
    if not missing:
        return 0
    if os.environ.get("CI", "").lower() == "true":
        print(f"unreachable: {', '.join(missing)}; CI=true requires every service", file=sys.stderr)
        return 1
    print(f"unreachable: {', '.join(missing)}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
