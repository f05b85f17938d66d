import sys

from compressor_2.cli import main

sys.exit(main())
