from homing.cli import main

main()
