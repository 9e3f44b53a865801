"""The benchmark room: what ``manage.py dbqueue_bench`` measures (:mod:`.runs`), the
driver-only yardstick beside it (:mod:`.baseline`) and the command's parts and report
(:mod:`.plan`). Nothing in the runtime imports it: a worker never loads the benchmark."""
