package cron_test

import (
	"fmt"
	"log"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/periodic"
	"github.com/sqlinbox/inbox/periodic/cron"
)

// An entry of a periodic.Scheduler that enqueues a report at 06:30 on
// weekdays, Paris time, and, after a downtime, the reports of up to five
// missed days.
func ExampleParse() {
	paris, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		log.Fatal(err)
	}
	weekdays, err := cron.Parse("30 6 * * mon-fri", paris)
	if err != nil {
		log.Fatal(err)
	}
	report := periodic.Entry{
		Name:     "daily-report",
		Schedule: weekdays,
		Job: func(tick time.Time) inbox.Job {
			return inbox.Job{Data: []any{[]byte("report for " + tick.In(paris).Format("2006-01-02"))}}
		},
		Missed: periodic.Backfill(5),
	}

	t := time.Date(2025, 3, 28, 12, 0, 0, 0, time.UTC) // a Friday
	for i := 0; i < 3; i++ {
		t = report.Schedule.Next(t)
		fmt.Println(t.In(paris).Format("Mon 2 Jan 15:04 MST"), string(report.Job(t).Data[0].([]byte)))
	}
	// Output:
	// Mon 31 Mar 06:30 CEST report for 2025-03-31
	// Tue 1 Apr 06:30 CEST report for 2025-04-01
	// Wed 2 Apr 06:30 CEST report for 2025-04-02
}
